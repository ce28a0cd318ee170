"""kvsim dashboard entry point (routes only; pages live in app_pages/)."""
import streamlit as st

st.set_page_config(page_title="kvsim", layout="wide")
st.title("kvsim")
st.write("The dashboard is being built; see README.")

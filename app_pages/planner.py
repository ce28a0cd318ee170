"""Page 4: model / GPU / dtype / TP / utilisation -> KV capacity; a small sweep."""
import streamlit as st

from app_pages import _state as S

st.title("Capacity planner")
st.caption("How many KV blocks and concurrent tokens a model gets on a GPU, following vLLM's "
           "formula: (GPU memory × utilisation − weights − activations) / bytes per KV token.")
planner = S.backend("planner.capacity")
if planner is None:
    st.info("The capacity planner is not available yet (branch plan); this page fills in when "
            "it lands.")
    st.stop()

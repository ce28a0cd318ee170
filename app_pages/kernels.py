"""Page 5: run the Triton paged-attention kernels on the current snapshot's block tables."""
import streamlit as st

from app_pages import _state as S

st.title("Kernel validation")
st.caption("The simulated block tables are real: feed one pool snapshot's tables to the Triton "
           "paged-attention kernels and compare with dense attention over the same tokens.")
bridge = S.backend("kernels.bridge")
if bridge is None:
    st.info("The kernel bridge is not available yet (branch kern); this page fills in when it "
            "lands.")
    st.stop()

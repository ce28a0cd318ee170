"""Every dashboard page through streamlit.testing.v1.AppTest: default run, bad input, page switch."""
import json
from pathlib import Path

import numpy as np
import pytest
from streamlit.testing.v1 import AppTest

from kvsim.dashboard.comparison import ALLOCATOR_LABELS
from kvsim.dashboard.launch import ENTRY_SCRIPT
from kvsim.dashboard import planning
from kvsim.dashboard.planning import SIM_SWEEP_METRICS
from kvsim.dashboard.playback import decode_player
from kvsim.planner.capacity import DEFAULT_GPU_MEMORY_UTILIZATION
from kvsim.dashboard import router
from kvsim.simulator.config import ALLOCATORS

ROOT = Path(__file__).resolve().parent.parent

PAGES = [f"app_pages/{name}" for name, _, _ in router.PAGES]  # relative to app.py
TIMEOUT_S = 120  # per script run; generous for a loaded 2-core CI machine


def _app() -> AppTest:
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=TIMEOUT_S)
    at.session_state["k_max_requests"] = 40  # small workload: the suite stays fast
    return at


def _clean(at: AppTest) -> None:
    assert not at.exception, [e.message for e in at.exception]
    assert not at.error, [e.value for e in at.error]


@pytest.fixture(scope="module")
def small():
    """One app session on a small built-in workload (shared by the tests of this module)."""
    return _app().run()


def player_payload(at: AppTest) -> dict:
    """The live pool's player element, decoded as the browser decodes it (player.js)."""
    players = at.get("bidi_component")
    assert len(players) == 1
    return decode_player(players[0].proto.bytes)


def test_live_pool_default_run(small):
    _clean(small)
    assert small.title[0].value == "Live KV-cache pool"
    data = player_payload(small)
    assert len(data["sides"]) == 2 and data["num_frames"] >= 100
    # it opens where the two pools together hold the most (issue 29 item 11: an upload opened on
    # an empty pool), not at a fixed tenth of the run
    held = np.sum([side["figures"]["kv_usage"] for side in data["sides"]], axis=0)
    assert data["start_frame"] == int(np.argmax(held)) and held[data["start_frame"]] > 0
    # the last frame comes after every request finished: nothing runs, waits or is held
    for side in data["sides"]:
        fig = side["figures"]
        assert fig["running"][-1] == fig["waiting"][-1] == fig["kv_usage"][-1] == 0
        assert fig["finished"][-1] == 40
        assert fig["token_states"][-1] == fig["reservation"][-1] == 0


def test_live_pool_frame_step_is_the_users_pick(small):
    small.selectbox(key="k_frame_s").set_value(0.5).run()
    _clean(small)
    times = player_payload(small)["times"]
    assert np.allclose(np.diff(times[:-1]), 0.5) and times[-1] - times[-2] <= 0.5
    small.selectbox(key="k_frame_s").set_value(0.0).run()


@pytest.mark.parametrize("page", PAGES[1:])
def test_every_page_default_run(small, page):
    small.switch_page(page).run()
    _clean(small)
    assert small.title


def test_state_survives_page_switches(small):
    small.switch_page("app_pages/block_table.py").run()
    small.selectbox(key="k_alloc_b").set_value("oracle").run()
    small.slider(key="k_frame").set_value(12).run()
    small.switch_page("app_pages/planner.py").run()
    small.selectbox(key="k_plan_gpu").set_value("H100-80GB-SXM").run()
    small.switch_page("app_pages/block_table.py").run()
    _clean(small)
    assert small.selectbox(key="k_alloc_b").value == "oracle"
    assert small.slider(key="k_frame").value == 12  # the inspector opens on the paused moment
    small.switch_page("app_pages/planner.py").run()
    assert small.selectbox(key="k_plan_gpu").value == "H100-80GB-SXM"


def test_same_allocator_on_both_sides():
    at = _app()
    at.session_state["k_alloc_b"] = "paged"
    at.run()
    for page in PAGES[:3]:  # the pages drawing one element per side
        at.switch_page(page).run()
        _clean(at)


def test_block_table_inspector_shows_the_picked_request(small):
    small.switch_page("app_pages/block_table.py").run()
    small.slider(key="k_frame").set_value(10).run()
    _clean(small)
    heads = [h.value for h in small.subheader]
    assert any(h.startswith("Block table of request") for h in heads)
    assert "slot_mapping" in heads
    small.radio(key="k_insp_side").set_value(1).run()  # the contiguous pool: its extent
    _clean(small)
    labels = [m.label for m in small.metric]
    assert labels[:2] == ["extent (cells)", "holding tokens"] and "free before" in labels
    first, last = (int(v) for v in small.metric[0].value.split("–"))
    assert last > first
    small.radio(key="k_insp_side").set_value(0).run()


BAD_AZURE = (b"TIMESTAMP,ContextTokens,GeneratedTokens\n"
             b"2023-11-16 18:15:46.6805900,374,44\n"
             b"2023-11-16 18:15:50.9951690,abc,12\n")


@pytest.mark.parametrize("page", ["app_pages/live_pool.py", "app_pages/metrics.py",
                                  "app_pages/block_table.py"])
def test_bad_upload_shows_the_loader_error_and_the_app_keeps_running(page):
    at = _app().run()
    at.switch_page(page).run()
    at.radio(key="k_source").set_value("upload a trace").run()
    at.file_uploader(key="upload_trace").set_value(("bad.csv", BAD_AZURE, "text/csv")).run()
    assert not at.exception
    assert [e.value for e in at.error] == ["bad.csv:3: field 'ContextTokens': not a number: 'abc'"]
    # never parsed as anything but a trace: a pickle is refused by its suffix
    at.file_uploader(key="upload_trace").set_value(
        ("evil.pkl", b"\x80\x04K\x01.", "application/octet-stream")).run()
    assert "unsupported file type .pkl" in at.error[0].value
    # the app still works: back to the built-in workload
    at.radio(key="k_source").set_value("built-in synthetic").run()
    assert not at.exception


def test_planner_impossible_configuration_is_an_error_not_a_crash():
    at = _app().run()
    at.switch_page("app_pages/planner.py").run()
    _clean(at)
    assert at.slider(key="k_plan_util").value == DEFAULT_GPU_MEMORY_UTILIZATION == 0.92
    blocks = int(at.metric[0].value.replace(",", ""))
    at.slider(key="k_plan_util").set_value(0.5).run()
    assert int(at.metric[0].value.replace(",", "")) < blocks  # less memory, fewer blocks
    at.selectbox(key="k_plan_model").set_value("Llama-3.1-70B").run()   # 70B on one A100-40GB
    assert not at.exception
    assert "weights need" in at.error[0].value


def test_planner_uses_the_sidebars_block_size_and_max_model_len():
    at = _app().run()
    at.switch_page("app_pages/planner.py").run()
    at.select_slider(key="k_block_size").set_value(32).run()
    at.select_slider(key="k_max_model_len").set_value(2048).run()
    _clean(at)
    assert [m.label for m in at.metric][2] == "2,048-token requests at once"
    blocks = int(at.metric[0].value.replace(",", ""))
    report = planning.capacity(at.selectbox(key="k_plan_model").value,
                               at.selectbox(key="k_plan_gpu").value, tp=1, kv_dtype="auto",
                               gpu_memory_utilization=0.92, block_size=32, max_model_len=2048)
    assert blocks == report["num_gpu_blocks"]
    assert "Block size **32** and max_model_len **2,048**" in at.info[0].value


def test_planner_reads_an_uploaded_hf_config():
    at = _app().run()
    at.switch_page("app_pages/planner.py").run()
    config = json.dumps({"_name_or_path": "acme/tiny-llama", "architectures": ["LlamaForCausalLM"],
                         "hidden_size": 1024, "intermediate_size": 2816, "num_attention_heads": 16,
                         "num_hidden_layers": 8, "num_key_value_heads": 4, "vocab_size": 32000,
                         "max_position_embeddings": 8192, "torch_dtype": "bfloat16"}).encode()
    at.file_uploader(key="upload_hf_config").set_value(("config.json", config, "application/json")).run()
    _clean(at)
    assert any("acme/tiny-llama" in c.value for c in at.caption)
    # 8 layers x 2 x 4 KV heads x 64 x 2 B = 8 KiB per token
    assert at.metric[3].value == "8 KiB"
    at.file_uploader(key="upload_hf_config").set_value(("config.json", b"{\"a\": 1}", "application/json")).run()
    assert not at.exception and "config.json" in at.error[0].value
    assert len(at.error) == 1   # once, not once per figure


def test_planner_names_an_uploaded_configs_defaults_and_near_misses():
    at = _app().run()
    at.switch_page("app_pages/planner.py").run()
    cfg = {"model_type": "llama", "hidden_size": 1024, "intermediate_size": 2816, "num_attention_heads": 16,
           "num_hidden_layers": 8, "vocab_size": 32000, "max_position_embeddings": 8192}
    at.file_uploader(key="upload_hf_config").set_value(
        ("config.json", json.dumps(cfg).encode(), "application/json")).run()
    assert not at.exception
    assert any("num_key_value_heads 16 (num_attention_heads" in w.value for w in at.warning)
    cfg["num_key_value_head"] = 4
    at.file_uploader(key="upload_hf_config").set_value(
        ("config.json", json.dumps(cfg).encode(), "application/json")).run()
    assert len(at.error) == 1 and "did you mean num_key_value_heads?" in at.error[0].value


def test_requests_that_can_never_fit_are_reported(small):
    small.switch_page("app_pages/live_pool.py").run()
    small.select_slider(key="k_max_model_len").set_value(1024).run()
    assert not small.exception
    warnings = [w.value for w in small.warning]
    rejected = [w for w in warnings if "requests rejected" in w]
    assert rejected and "max_model_len = 1024" in rejected[0]
    assert "raise max_model_len" in rejected[0]   # these prompts are longer than it
    small.select_slider(key="k_max_model_len").set_value(4096).run()
    assert not [w.value for w in small.warning if "rejected" in w.value]


def test_planner_simulated_sweep_on_demand(small):
    small.switch_page("app_pages/planner.py").run()
    charts = len(small.get("plotly_chart"))
    small.toggle(key="k_plan_sim_on").set_value(True).run()
    _clean(small)
    assert len(small.get("plotly_chart")) == charts + len(SIM_SWEEP_METRICS)
    # the sweep says which clock priced its points
    assert any(c.value.startswith("clock") for c in small.caption)
    small.toggle(key="k_plan_sim_on").set_value(False).run()


def test_planner_hit_rate_curves_on_demand(small):
    small.switch_page("app_pages/planner.py").run()
    charts = len(small.get("plotly_chart"))
    small.toggle(key="k_plan_curve_on").set_value(True).run()
    _clean(small)
    assert len(small.get("plotly_chart")) == charts + 1
    assert any("GPU pool" in m.value for m in small.markdown)
    small.toggle(key="k_plan_curve_on").set_value(False).run()


def test_live_pool_shows_the_cpu_tier_beside_the_pool(small):
    small.switch_page("app_pages/live_pool.py").run()
    charts = len(small.get("plotly_chart"))
    small.select_slider(key="k_cpu_offload").set_value(0.5).run()
    _clean(small)
    assert len(small.get("plotly_chart")) == charts + 1     # the paged side's tiers
    small.select_slider(key="k_cpu_offload").set_value(0.0).run()


def test_kernel_validation_runs_the_triton_kernels_on_the_snapshot(small):
    # the paged pool at the opening frame, while requests hold memory (other tests move it)
    small.session_state["k_frame"] = 10
    small.session_state["k_kern_side"] = 0
    small.switch_page("app_pages/kernels.py").run()
    _clean(small)
    checked, within, worst, bitwise = [m.value for m in small.metric][:4]
    assert int(checked) >= 1 and within == f"{checked} / {checked}" and bitwise == "all"
    assert float(worst) < 1e-5  # float32 tolerance
    small.selectbox(key="k_kern_dtype").set_value("float16").run()
    _clean(small)
    assert 1e-5 < float(small.metric[2].value) < 2e-3  # half precision: visibly larger, in bound
    # the frame's whole engine step, in one unified launch: one row per scheduled sequence
    small.toggle(key="k_kern_step").set_value(True).run()
    _clean(small)
    checked, within = small.metric[0].value, small.metric[1].value
    assert int(checked) >= 1 and within == f"{checked} / {checked}"


def test_live_pool_on_a_shared_trace(shared_traces):
    at = _app().run()
    at.radio(key="k_source").set_value("shared trace").run()
    at.selectbox(key="k_shared_trace").set_value(
        "azure_llm_2023/AzureLLMInferenceTrace_conv.csv").run()
    _clean(at)
    assert player_payload(at)["num_frames"] >= 2
    assert "azure_llm_2023/AzureLLMInferenceTrace_conv.csv" in at.selectbox(
        key="k_shared_trace").options


def test_the_sidebar_offers_every_simulator_allocator(small):
    small.switch_page("app_pages/live_pool.py").run()
    labels = [ALLOCATOR_LABELS[a] for a in ALLOCATORS]
    assert small.selectbox(key="k_alloc_a").options == labels
    assert small.selectbox(key="k_alloc_b").options == labels


def test_the_packaged_entry_script_routes_every_page():
    """What `kvsim dashboard` runs (from a wheel too): the pages by their path in the package."""
    at = AppTest.from_file(str(ENTRY_SCRIPT), default_timeout=TIMEOUT_S)
    at.session_state["k_max_requests"] = 40
    at.run()
    _clean(at)
    assert at.title[0].value == "Live KV-cache pool"
    for name, _, _ in router.PAGES[1:]:
        at.switch_page(str(router.PAGES_DIR / name)).run()
        _clean(at)
        assert at.title


def test_a_good_upload_is_simulated_and_survives_a_page_switch():
    rows = "".join(f"{0.5 * i},{100 + 37 * i},{20 + 5 * i}\n" for i in range(12))
    at = _app().run()
    at.radio(key="k_source").set_value("upload a trace").run()
    at.file_uploader(key="upload_trace").set_value(
        ("mine.csv", ("arrival_s,prompt_tokens,output_tokens\n" + rows).encode(), "text/csv")).run()
    _clean(at)
    assert player_payload(at)["sides"][0]["figures"]["finished"][-1] == 12
    at.switch_page("app_pages/metrics.py").run()
    _clean(at)
    assert "Using mine.csv" in [c.value for c in at.sidebar.caption]
    table = at.dataframe[0].value  # the summary table (in its expander)
    assert set(table.loc["requests_finished"]) == {"12"}  # both sides served all 12 requests


def test_kv_groups_page_shows_each_group_and_a_window_freeing_blocks():
    at = _app()
    at.session_state["k_hyb_requests"] = 40
    at.run()
    at.switch_page("app_pages/kv_groups.py").run()
    _clean(at)
    assert at.title[0].value == "KV-cache groups (hybrid models)"
    at.slider(key="k_hyb_frame").set_value(30).run()
    _clean(at)
    assert "One request's tables" in [h.value for h in at.subheader]
    groups = at.dataframe[0].value
    assert list(groups["group"]) == ["sliding:128", "full"]
    # a bad groups spelling is one st.error, not a crash
    shape = at.session_state["k_hyb_shape"]
    at.text_input(key=f"k_hyb_groups_{shape}").set_value("full,window:3").run()
    assert not at.exception
    assert "entry 2" in at.error[0].value


def test_planner_concurrency_sweep_and_rate_search(small):
    small.switch_page("app_pages/planner.py").run()
    charts = len(small.get("plotly_chart"))
    small.toggle(key="k_plan_bench_on").set_value(True).run()
    small.multiselect(key="k_plan_bench_conc").set_value([1, 8, 32]).run()
    _clean(small)
    assert len(small.get("plotly_chart")) == charts + 1
    assert any(c.value.startswith("clock") for c in small.caption)
    small.toggle(key="k_plan_bench_on").set_value(False).run()
    small.toggle(key="k_plan_rate_on").set_value(True).run()
    _clean(small)
    labels = [m.label for m in small.metric]
    assert "Highest rate meeting the SLO" in labels and "p99 TTFT there" in labels
    # the answer says its clock, and that clock's error against real vLLM where it was measured
    (clock,) = [c.value for c in small.caption if c.value.startswith("clock")]
    assert "against real vLLM" in clock
    small.text_input(key="k_plan_rate_slo").set_value("p99_ttft_lag<=5").run()
    assert not small.exception and any("unknown metric" in e.value for e in small.error)
    small.toggle(key="k_plan_rate_on").set_value(False).run()


def test_the_default_demo_opens_unloaded():
    """Issue 29 item 11: the built-in demo opened under an "Overloaded" banner (the max side held
    two requests of its 8,192-token pool: p50 TTFT 228 s)."""
    at = _app()
    at.session_state["k_max_requests"] = 120     # the page's own default
    at.run()
    _clean(at)
    assert not [w.value for w in at.warning if "Overloaded" in w.value]


def test_a_contiguous_side_shows_no_prefix_caching():
    at = _app().run()
    right = at.sidebar.toggle(key="k_prefix_b_off")
    assert right.value is False and right.disabled and "contiguous" in right.label
    at.selectbox(key="k_alloc_b").set_value("paged").run()
    assert at.sidebar.toggle(key="k_prefix_b").value is True and not at.sidebar.toggle(key="k_prefix_b").disabled


def test_an_upload_gets_a_max_model_len_that_holds_its_longest_request():
    rows = "".join(f"{0.5 * i},{100 + 900 * i},{20}\n" for i in range(8))   # longest 6,420 tokens
    at = _app().run()
    at.radio(key="k_source").set_value("upload a trace").run()
    at.file_uploader(key="upload_trace").set_value(
        ("long.csv", ("arrival_s,prompt_tokens,output_tokens\n" + rows).encode(), "text/csv")).run()
    _clean(at)
    assert at.session_state["k_max_model_len"] == 8192
    assert "max_model_len set to 8,192: the trace's longest request is 6,420 tokens" in \
        [c.value for c in at.sidebar.caption]
    assert not [w.value for w in at.warning if "rejected" in w.value]
    at.select_slider(key="k_max_model_len").set_value(16384).run()   # the user's pick then stays
    assert at.session_state["k_max_model_len"] == 16384


def test_the_planner_opens_on_an_h100():
    at = _app().run()
    at.switch_page("app_pages/planner.py").run()
    assert at.selectbox(key="k_plan_gpu").value == "H100-80GB-SXM"

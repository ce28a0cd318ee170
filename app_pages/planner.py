"""Page 4: model (preset or config.json) / GPU / dtype / TP / utilisation -> KV capacity; sweeps.

Block size and max_model_len are the sidebar's (one set of controls for every page)."""
import streamlit as st

from kvsim.errors import InputError
from kvsim.app_pages import _state as S
from kvsim.app_pages import _ui
from kvsim.dashboard.planning import (BENCH_CONCURRENCIES, SIM_SWEEP_METRICS, SIM_SWEEPS, SWEEP_COLUMNS,
                                      SWEEPS, capacity)
from kvsim.dashboard.sources import MAX_UPLOAD_MB, user_message
from kvsim.planner.capacity import DEFAULT_GPU_MEMORY_UTILIZATION
from kvsim.planner.engine_setup import DEFAULT_GPU
from kvsim.planner.presets import GPU_PRESETS, MODEL_PRESETS
from kvsim.planner.sweep import clock_lines
from kvsim.viz.cache_curve import cache_curve_figure
from kvsim.viz.capacity import gpu_memory_figure
from kvsim.viz.plan_figures import pareto_figure, sweep_metric_figure
from kvsim.viz.style import color_allocator_traces

st.title("Capacity planner")
st.caption("How many KV blocks a model gets on a GPU, by vLLM's formula: (GPU memory × "
           "gpu_memory_utilization − weights − activation peak − non-PyTorch memory) / bytes per "
           "block. Blocks / blocks per max_model_len request = how many such requests fit at once.")
scenario = _ui.scenario_sidebar()  # block size and max_model_len: the sidebar's, for every figure
block_size, max_model_len = (st.session_state["k_block_size"], st.session_state["k_max_model_len"])
models, gpus = list(MODEL_PRESETS), list(GPU_PRESETS)
# an H100 by default, as every command (an A100-40GB holds no 30B model, and an uploaded one
# repeated its one error in every figure)
S.defaults(k_plan_model=models[0], k_plan_gpu=DEFAULT_GPU if DEFAULT_GPU in gpus else gpus[0], k_plan_tp=1,
           k_plan_util=DEFAULT_GPU_MEMORY_UTILIZATION, k_plan_dtype="auto", k_plan_sweep="tp")
c = st.columns(4)
model = c[0].selectbox("Model", models, key="k_plan_model")
gpu = c[1].selectbox("GPU", gpus, key="k_plan_gpu")
tp = c[2].select_slider("Tensor parallel", [1, 2, 4, 8], key="k_plan_tp")
kv_dtype = c[3].selectbox("KV dtype", ["auto", "bf16", "fp8"], key="k_plan_dtype",
                          help="auto = the model's dtype; fp8 halves the KV bytes per token.")
hf = st.file_uploader("…or a Hugging Face config.json (it replaces the model above)",
                      type=["json"], key="upload_hf_config", max_upload_size=MAX_UPLOAD_MB)
if hf is not None:
    try:
        model = S.store_hf_config(hf.name, hf.getvalue())
        spec = S.resolve_model(model)
        st.caption(f"Model from {hf.name}: **{spec.name}**")
        for note in spec.config_notes:   # the defaults taken and the fields not read
            st.warning(f"{hf.name}: {note}")
    except InputError as err:  # not a model config, or a field it lacks
        st.error(str(err))
        st.stop()   # the page's figures would repeat the one error
util = st.slider("gpu_memory_utilization", 0.3, 0.98, step=0.01, key="k_plan_util",
                 help=f"vLLM 0.33's default is {DEFAULT_GPU_MEMORY_UTILIZATION}.")
st.info(f"Block size **{block_size}** and max_model_len **{max_model_len:,}** come from the "
        "sidebar and apply to every figure on this page (and to the simulated what-if).",
        icon=":material/tune:")
kwargs = dict(tp=tp, kv_dtype=kv_dtype, gpu_memory_utilization=util, block_size=block_size,
              max_model_len=int(max_model_len))
try:
    report = capacity(model, gpu, **kwargs)
except InputError as err:
    st.error(str(err))
    report = None
if report is not None:
    m = st.columns(4)
    m[0].metric("KV blocks per GPU", f"{report['num_gpu_blocks']:,}")
    m[1].metric("KV cache tokens", f"{report['kv_cache_tokens']:,}")
    m[2].metric(f"{report['max_model_len']:,}-token requests at once",
                f"{report['max_concurrency']:.1f}")
    m[3].metric("KV per token", f"{report['kv_bytes_per_token'] / 1024:.0f} KiB")
    st.plotly_chart(gpu_memory_figure(report), key="plan_mem")

st.subheader("Sweep")
param = st.radio("Vary", list(SWEEPS), key="k_plan_sweep", horizontal=True,
                 format_func=lambda p: SWEEPS[p][0])
base = tuple(sorted((k, v) for k, v in kwargs.items() if k != param))
sweep = S.capacity_sweep(model, gpu, param, base)
for col, (metric, title) in zip(st.columns(len(SWEEP_COLUMNS)), SWEEP_COLUMNS.items()):
    fig = sweep_metric_figure(sweep, param, metric, title=title)
    fig.update_layout(height=300, showlegend=False, xaxis_title=SWEEPS[param][0],
                      yaxis_title=None)
    fig.update_xaxes(type="category")  # discrete settings: one tick per swept value
    col.plotly_chart(fig, key=f"plan_sweep_{metric}")
bad = sweep[sweep["error"].notna()]
if len(bad):
    st.caption("Impossible points (gaps): " + " · ".join(
        f"{row[param]}: {row['error']}" for _, row in bad.iterrows()))

st.subheader("Simulated what-if")
st.caption("Replays the sidebar's workload on this model and GPU: the pool is vLLM's "
           "num_gpu_blocks from above, each step costs what kvsim's default clock says: real vLLM's "
           "steps measured for this model on this GPU where tables/vllm/ has them, else the roofline "
           "(weights and KV bytes over memory bandwidth, FLOPs over peak). One line per sidebar allocator.")
S.defaults(k_plan_sim_on=False, k_plan_sim_param="rate")
simulate = st.toggle("Simulate the sweep (a few seconds)", key="k_plan_sim_on")
if simulate and scenario is not None:
    sim_param = st.radio("Vary", list(SIM_SWEEPS), key="k_plan_sim_param", horizontal=True,
                         format_func=lambda p: SIM_SWEEPS[p][0])
    sim_base = tuple(sorted({"model": model, "gpu": gpu, **kwargs}.items()))
    try:
        table = S.simulated_sweep(scenario.workload, scenario.allocators, sim_param, sim_base)
    except InputError as err:  # a bad trace
        st.error(user_message(err, scenario.workload))
        table = None
    if table is not None:
        ok = table[table["error"].isna()]
        if len(ok):
            for col, (metric, title) in zip(st.columns(len(SIM_SWEEP_METRICS)),
                                            SIM_SWEEP_METRICS.items()):
                fig = sweep_metric_figure(table, sim_param, metric, group_by=["allocator"],
                                          title=title)
                fig.update_layout(height=300, xaxis_title=SIM_SWEEPS[sim_param][0],
                                  yaxis_title=None, legend=dict(orientation="h", y=-0.35))
                fig.update_xaxes(type="category")
                col.plotly_chart(color_allocator_traces(fig), key=f"plan_sim_{metric}")
            over = ok[ok["overloaded"].fillna(False).astype(bool)] if "overloaded" in ok else ok.iloc[:0]
            if len(over):
                st.warning("Overloaded points (their queues grow through the run, so their "
                           "latencies measure the queue): " + " · ".join(
                               f"{r['allocator']}, {sim_param} = {r[sim_param]}" for _, r in over.iterrows()))
        for _, row in table[table["error"].notna()].iterrows():
            st.error(f"{row['allocator']}, {sim_param} = {row[sim_param]}: {row['error']}")
        for line in clock_lines(table.to_dict("records"), lambda r: f"{r['allocator']} at {r[sim_param]}"):
            st.caption(line)

st.subheader("Throughput against interactivity")
st.caption("vllm bench serve's random dataset replayed as a closed loop at each client concurrency "
           "(at most C requests in flight, the next sent as one finishes) on each GPU: output "
           "throughput per GPU against tokens per second for each user (1000 / mean TPOT), the "
           "Pareto front ringed, as InferenceMAX draws it. The step times are kvsim's default clock's "
           "(real vLLM's measured steps where a table fits the model and GPU, else the roofline).")
S.defaults(k_plan_bench_on=False, k_plan_bench_isl=1024, k_plan_bench_osl=1024,
           k_plan_bench_gpus=[gpu], k_plan_bench_conc=list(BENCH_CONCURRENCIES))
if st.toggle("Simulate the concurrency sweep", key="k_plan_bench_on"):
    c = st.columns(3)
    isl = c[0].number_input("Input tokens (ISL)", 1, 131072, step=256, key="k_plan_bench_isl")
    osl = c[1].number_input("Output tokens (OSL)", 1, 131072, step=256, key="k_plan_bench_osl")
    bench_gpus = c[2].multiselect("GPUs", gpus, key="k_plan_bench_gpus")
    concs = st.multiselect("Concurrencies", BENCH_CONCURRENCIES, key="k_plan_bench_conc")
    if not bench_gpus or not concs:
        st.error("Pick at least one GPU and one concurrency.")
    else:
        cap = tuple(sorted((k, v) for k, v in kwargs.items()))
        table = S.bench_sweep(model, tuple(bench_gpus), int(isl), int(osl), 4 * max(concs),
                              tuple(sorted(concs)), cap)
        for _, row in table[table["error"].notna()].iterrows():
            st.error(f"{row['gpu']}, concurrency {row['concurrency']}: {row['error']}")
        if table["error"].isna().any():
            st.plotly_chart(pareto_figure(table, group_by=["gpu"]), key="plan_bench_pareto")
        for line in clock_lines(table.to_dict("records"), lambda r: f"{r['gpu']} at C = {r['concurrency']}"):
            st.caption(line)

st.subheader("Highest rate under an SLO")
st.caption("The highest arrival rate of the sidebar's workload on this model and GPU that meets "
           "the SLO, found by bisection on replays (vllm bench serve's metric names, in ms); the "
           "replay at the answer is shown, and 5 % more traffic misses the SLO.")
S.defaults(k_plan_rate_on=False, k_plan_rate_slo="p99_ttft_ms<=500,p99_tpot_ms<=50")
if st.toggle("Search the rate", key="k_plan_rate_on"):
    slo = st.text_input("SLO", key="k_plan_rate_slo",
                        help="Terms METRIC OP NUMBER, comma-separated: p99_ttft_ms, p90_tpot_ms, "
                             "median_e2el_ms, mean_itl_ms, ...")
    if scenario is not None:
        try:
            found = S.max_rate(scenario.workload, model, gpu, tuple(sorted(kwargs.items())), slo)
        except InputError as err:   # a bad SLO, trace or configuration
            st.error(user_message(err, scenario.workload))
            found = None
        if found is not None and found["status"] == "never":
            st.warning(f"No rate meets {slo}: even the slowest probed "
                       f"({min(r for r, _ in found['probes']):.4g} requests/s) misses it.")
        elif found is not None:
            row = found["row"]
            m = st.columns(4)
            m[0].metric("Highest rate meeting the SLO", f"{found['max_rate']:.3g} req/s",
                        help="" if found["status"] == "found" else "meets it at every rate probed")
            m[1].metric("p99 TTFT there", f"{row['p99_ttft_ms']:.0f} ms")
            m[2].metric("p99 TPOT there", f"{row['p99_tpot_ms']:.1f} ms")
            m[3].metric("Output throughput", f"{row['output_throughput']:,.0f} tok/s")
            st.caption(f"{len(found['probes'])} replays; at {found['next_rate'] or 0:.3g} requests/s "
                       "(5 % more) the SLO is missed." if found["status"] == "found" else
                       f"{len(found['probes'])} replays.")
            # the answer is the clock's: which one, and how close it came to real vLLM
            for line in clock_lines([row]):
                st.caption(line)

st.subheader("Hit rate by cache size")
st.caption("The prefix-cache hit rate of the sidebar's workload for every cache size (LRU, one "
           "pass over its block keys) and the best any eviction policy could reach (MIN), with "
           "this model's GPU pool on this GPU marked. A CPU tier shows the curve of what vLLM "
           "offloads (prompts), and the target asks for the smallest GPU + CPU cache.")
S.defaults(k_plan_curve_on=False, k_plan_curve_cpu=0.0, k_plan_curve_target=0.3)
if st.toggle("Compute the curves", key="k_plan_curve_on"):
    c = st.columns(2)
    cpu_gib = c[0].number_input("CPU offload tier (GiB)", 0.0, 4096.0, step=16.0,
                                key="k_plan_curve_cpu")
    target = c[1].slider("Target hit rate", 0.01, 1.0, step=0.01, key="k_plan_curve_target")
    if scenario is not None:
        try:
            curve = S.cache_curve(scenario.workload, model, gpu, tuple(sorted(kwargs.items())),
                                  cpu_gib, target)
        except InputError as err:   # a bad trace or configuration
            st.error(user_message(err, scenario.workload))
            curve = None
        if curve is not None:
            st.plotly_chart(cache_curve_figure(curve.table, x="cache_gib", marks=curve.marks),
                            key="plan_curve")
            st.markdown("\n".join(f"- {line}" for line in curve.lines))

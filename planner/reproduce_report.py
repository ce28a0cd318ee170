"""The outputs of `kvsim reproduce vllm-paper`, from the results dict alone: the comparison with
the paper (``differences``, ``ordering_checks``), report.md, report.html and ``write_outputs``.

All are pure functions of the results (no clock, no random ids), so the same results give the
same bytes. ``planner.reproduce`` runs the experiments; this module only reads what they return.
"""
from __future__ import annotations

import html
import json
import os
from pathlib import Path
from typing import Any

from kvsim.planner.reproduce import FIG15_MODES, FIG15_NS, WORKLOADS
from kvsim.simulator.result import prepare_output_dir
from kvsim.viz.repro_figures import (FIG2_CLASSES, FIG2_LABELS, REPORT_SYSTEMS, SYSTEM_LABELS,
                                     SYSTEMS, report_systems)

WORKLOAD_TITLES = {"sharegpt": "ShareGPT-like (synthetic)", "alpaca": "Alpaca-like (synthetic)",
                   "sharegpt_real": "real ShareGPT lengths (filtered)"}


def _f(x: Any, nd: int = 1) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:.{nd}f}"
    return str(x)


def _delta(ours: Any, ref: Any, nd: int = 1) -> str:
    if ours is None or ref is None:
        return ""
    d = ours - ref
    return f"{d:+.{nd}f}"


def fig2_rows(results: dict[str, Any], key: str = "fig2") -> list[list[str]]:
    """One row per (system, source): the four shares."""
    paper = results["paper"]["fig2"]
    rows = []
    for s in report_systems(results[key]):
        rows.append([SYSTEM_LABELS[s], "paper"] + [_f(paper[s][c]) for c in FIG2_CLASSES])
        rows.append(["", "kvsim"] + [_f(results[key][s][c]) for c in FIG2_CLASSES])
        rows.append(["", "kvsim - paper"]
                    + [_delta(results[key][s][c], paper[s][c]) for c in FIG2_CLASSES])
    return rows


def fig13_rows(results: dict[str, Any]) -> list[list[str]]:
    rows = []
    for wl, by_system in results["fig13"].items():
        paper = results["paper"]["fig13"].get(wl, {})
        for s in report_systems(by_system):
            ref = paper.get(s)
            ours = by_system[s]
            ratio = f"{ours / ref:.2f}" if ours is not None and ref else ""
            rows.append([WORKLOAD_TITLES.get(wl, wl), SYSTEM_LABELS[s], _f(ref, 2), _f(ours, 2), ratio])
    return rows


def fig15_rows(results: dict[str, Any]) -> list[list[str]]:
    rows = []
    for m in FIG15_MODES:
        for n in FIG15_NS:
            ref = results["paper"]["fig15"][m][str(n)]
            ours = results["fig15"][m][str(n)]
            rows.append(["parallel sampling" if m == "parallel" else "beam search", str(n),
                         _f(ref), _f(ours), _delta(ours, ref)])
    return rows


def _md_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def _setup_lines(results: dict[str, Any]) -> list[str]:
    st = results["setup"]
    return [
        f"- Model / GPU: {st['model']} on one {st['gpu']}; KV cache {st['kv_cache_bytes'] / 2**30:g} GiB, "
        f"{st['kv_bytes_per_token'] // 1024} KiB per token -> {st['capacity_tokens']:,} token slots "
        f"({st['num_blocks']} blocks of {st['block_size']}).",
        f"- Max sequence length {st['max_model_len']}: synthetic requests over it are dropped (the presets "
        f"redraw them, so none are); rows of the real ShareGPT file are dropped as vLLM's benchmark sampler "
        f"of the time did (prompt > {st['max_prompt_tokens']}, prompt + output > {st['max_model_len']}, "
        f"either side < {st['min_tokens']} tokens).",
        f"- Traces: Poisson arrivals over {st['duration_s']:g} s; ShareGPT at {st['sharegpt_rate']:g} req/s, "
        f"Alpaca at {st['alpaca_rate']:g} req/s; Fig. 15 on {st['fig15_workload']} at {st['fig15_rate']:g} req/s; "
        f"seed {st['seed']}.",
        f"- Orca: one contiguous reservation per request, placement `{st['placement']}`; vLLM: paged, "
        f"watermark {st['watermark']:g}, no prefix caching, vLLM v0's scheduler (prompt-only steps, "
        f"then decode steps: the paper's engine); the row \"{SYSTEM_LABELS['vllm_v1']}\" runs kvsim's "
        f"v1 scheduler (vLLM 0.33's, prefills and decodes in one step) on the same pool, and so does "
        f"Fig. 15 (forked sequences). max_num_seqs {st['max_num_seqs']}, "
        f"max_num_batched_tokens {st['max_num_batched_tokens']}.",
        f"- Step times: roofline cost model of planner/roofline.py (x{st['step_time_scale']:g}).",
        f"- Averages: time-weighted over samples every {st['sample_interval_s']:g} s in [0, {st['duration_s']:g}) s; "
        f"Fig. 15 from pool snapshots every {st['snapshot_interval_s']:g} s.",
    ]


def _sensitivity_lines(results: dict[str, Any]) -> list[str]:
    """report.md's sensitivity tables, those the run has."""
    out: list[str] = []
    sens = results.get("sensitivity", {})
    avg = sens.get("fig2_averaging")
    if avg:
        rows = []
        for s in SYSTEMS:
            for how in ("pool", "held_only", "saturated_only"):
                rows.append([SYSTEM_LABELS[s], how] + [_f(avg[s][how][c]) for c in FIG2_CLASSES])
        out += ["How Fig. 2's shares are averaged: over the whole pool (default), over the slots "
                "requests hold (free and external excluded), over the samples with a request waiting.",
                "", _md_table(["system", "averaging"] + [FIG2_LABELS[c] + " %" for c in FIG2_CLASSES], rows), ""]
    rate = sens.get("sharegpt_rate")
    if rate:
        rows = [[r, SYSTEM_LABELS[s], _f(rate[r][s]["token_states"]), _f(rate[r][s]["mean_running"], 2),
                 _f(rate[r][s]["saturated_fraction"], 2)]
                for r in sorted(rate, key=float) for s in SYSTEMS]
        out += ["ShareGPT request rate:", "",
                _md_table(["req/s", "system", "token states %", "batched requests", "time with a queue"], rows), ""]
    shape = sens.get("sharegpt_output_sigma")
    if shape:
        rows = [[k, SYSTEM_LABELS[s], *(_f(v[c]) for c in FIG2_CLASSES), _f(v["mean_running"], 2)]
                for k, by_s in sorted(shape.items(), key=lambda kv: float(kv[0].split()[0]))
                for s, v in by_s.items()]
        out += ["ShareGPT output-length shape (lognormal log-sd; kvsim's preset is 1, means kept at the "
                "paper's):", "",
                _md_table(["output sigma", "system", *(FIG2_LABELS[c] + " %" for c in FIG2_CLASSES),
                           "batched requests"], rows), ""]
    scale = sens.get("step_time_scale")
    if scale:
        rows = [[k, WORKLOAD_TITLES.get(wl, wl), SYSTEM_LABELS[s], _f(v["mean_running"], 2), _f(v["token_states"])]
                for k, by_wl in sorted(scale.items(), key=lambda kv: float(kv[0]))
                for wl, by_s in by_wl.items() for s, v in by_s.items()]
        out += ["Step time (roofline x factor): batched requests and token-state share:", "",
                _md_table(["step time x", "workload", "system", "batched requests", "token states %"], rows), ""]
    place = sens.get("placement")
    if place:
        rows = [[p, SYSTEM_LABELS[s], _f(v["token_states"]), _f(v["external_and_other"]), _f(v["mean_running"], 2)]
                for p, by in place.items() for s, v in by.items()]
        out += ["Orca placement (the paper assumes buddy):", "",
                _md_table(["placement", "system", "token states %", "external & other %", "batched requests"], rows), ""]
    sg15 = sens.get("fig15_sharegpt")
    if sg15:
        rows = [[m, str(n), _f(sg15[m][str(n)]),
                 f"{sg15[m]['paper_range'][0]:g} - {sg15[m]['paper_range'][1]:g} (n = 2 .. 6)"]
                for m in FIG15_MODES for n in FIG15_NS]
        out += [f"Fig. 15 on ShareGPT at {results['setup']['fig15_sharegpt_rate']:g} req/s (the paper gives "
                "only ranges, in the text):", "",
                _md_table(["decoding", "n", "kvsim %", "paper %"], rows), ""]
    mean_ratio = sens.get("fig15_mean_of_ratios")
    if mean_ratio:
        rows = [[m, str(n), _f(results["fig15"][m][str(n)]), _f(mean_ratio[m][str(n)])]
                for m in FIG15_MODES for n in FIG15_NS]
        out += ["Fig. 15 averaging: ratio of time-averaged counts (default) vs mean of per-snapshot ratios:", "",
                _md_table(["decoding", "n", "ratio of sums %", "mean of ratios %"], rows), ""]
    return out


def render_markdown(results: dict[str, Any]) -> str:
    """report.md: setup, the three figures (paper vs kvsim), real trace, sensitivity, flags."""
    out = ["# kvsim reproduction of the vLLM paper's memory results", "",
           "Kwon et al., *Efficient Memory Management for Large Language Model Serving with "
           "PagedAttention*, SOSP 2023. Explanations of every flagged difference: docs/REPRODUCTION.md.",
           "", "## Setup", ""]
    out += _setup_lines(results)
    out += ["", "### Workloads", "",
            _md_table(["trace", "requests", "mean prompt", "mean output", "dropped (long / short)"],
                      [[k, _f(v.get("num_requests")), _f(v.get("mean_prompt_tokens")),
                        _f(v.get("mean_output_tokens")),
                        f"{v.get('num_dropped_too_long', v.get('rows_too_long', '-'))} / "
                        f"{v.get('num_dropped_too_short', v.get('rows_too_short', '-'))}"]
                       for k, v in results["workloads"].items()])]
    header = ["system", "source"] + [FIG2_LABELS[c] + " %" for c in FIG2_CLASSES]
    out += ["", "## Fig. 2: share of KV memory (ShareGPT)", "", _md_table(header, fig2_rows(results))]
    if "fig2_sharegpt_real" in results:
        out += ["", "### Fig. 2 on the real ShareGPT length file", "",
                _md_table(header, fig2_rows(results, "fig2_sharegpt_real"))]
    out += ["", "## Fig. 13: average number of batched requests", "",
            _md_table(["workload", "system", "paper", "kvsim", "kvsim / paper"], fig13_rows(results)),
            "", "## Fig. 15: memory saved by sharing (%)", "",
            _md_table(["decoding", "n", "paper", "kvsim", "kvsim - paper"], fig15_rows(results))]
    checks = ordering_checks(results)
    out += ["", "## Orderings the paper reports", ""]
    out += [f"- {k}: {'holds' if v else 'DOES NOT HOLD'}" for k, v in checks.items()]
    out += ["", "## Sensitivity", ""]
    out += _sensitivity_lines(results)
    flagged = [d for d in differences(results) if d["flag"]]
    out += ["## Differences larger than 3 points (shares) or 10 % (concurrency)", ""]
    if flagged:
        out += [f"- `{d['key']}`: paper {_f(d['paper'], 2)}, kvsim {_f(d['kvsim'], 2)} ({d['delta']:+.2f})"
                for d in flagged]
    else:
        out.append("- none")
    out.append("")
    return "\n".join(out)


def _html_table(header: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def render_html(results: dict[str, Any]) -> str:
    """report.html: the charts (plotly, library inlined once, fixed div ids) and the tables."""
    import plotly.io as pio

    from kvsim.viz.repro_figures import all_figures

    parts = []
    for i, (fig_id, fig) in enumerate(all_figures(results)):
        parts.append(pio.to_html(fig, full_html=False, include_plotlyjs=(i == 0),
                                 div_id=f"kvsim-repro-{fig_id}", config={"displaylogo": False}))
    header = ["system", "source"] + [FIG2_LABELS[c] + " %" for c in FIG2_CLASSES]
    checks = ordering_checks(results)
    flagged = [d for d in differences(results) if d["flag"]]
    setup = "".join(f"<li>{html.escape(line[2:])}</li>" for line in _setup_lines(results))
    return "\n".join([
        "<!doctype html>", "<html><head><meta charset='utf-8'>",
        "<title>kvsim: vLLM paper reproduction</title>",
        "<style>body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em}"
        "table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:3px 8px;"
        "text-align:right}th{background:#f3f3f3}</style></head><body>",
        "<h1>kvsim reproduction of the vLLM paper's memory results</h1>",
        "<p>Kwon et al., SOSP 2023. Every flagged difference is explained in docs/REPRODUCTION.md.</p>",
        f"<h2>Setup</h2><ul>{setup}</ul>",
        *parts,
        "<h2>Fig. 2 (ShareGPT)</h2>", _html_table(header, fig2_rows(results)),
        "<h2>Fig. 13</h2>", _html_table(["workload", "system", "paper", "kvsim", "kvsim / paper"],
                                         fig13_rows(results)),
        "<h2>Fig. 15</h2>", _html_table(["decoding", "n", "paper", "kvsim", "kvsim - paper"], fig15_rows(results)),
        "<h2>Orderings the paper reports</h2><ul>"
        + "".join(f"<li>{html.escape(k)}: {'holds' if v else '<b>does not hold</b>'}</li>" for k, v in checks.items())
        + "</ul>",
        "<h2>Differences &gt; 3 points or 10 %</h2><ul>"
        + ("".join(f"<li><code>{html.escape(d['key'])}</code>: paper {_f(d['paper'], 2)}, "
                   f"kvsim {_f(d['kvsim'], 2)}</li>" for d in flagged) or "<li>none</li>")
        + "</ul>",
        "</body></html>", ""])


# ---------------------------------------------------------------------------------------------
# Outputs
# ---------------------------------------------------------------------------------------------

def flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}`` (the dotted keys the docs name)."""
    out: dict[str, Any] = {}
    for k, v in tree.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


def expected_figure_keys(include_real: bool = False) -> list[str]:
    """The dotted keys results.json must hold for the three figures."""
    keys = [f"fig2.{s}.{c}" for s in REPORT_SYSTEMS for c in FIG2_CLASSES]
    wls = WORKLOADS + (("sharegpt_real",) if include_real else ())
    keys += [f"fig13.{w}.{s}" for w in wls for s in REPORT_SYSTEMS]
    keys += [f"fig15.{m}.{n}" for m in FIG15_MODES for n in FIG15_NS]
    if include_real:
        keys += [f"fig2_sharegpt_real.{s}.{c}" for s in REPORT_SYSTEMS for c in FIG2_CLASSES]
    return keys


def differences(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Every measured figure next to the paper's, with the flag the docs must explain.

    A difference is flagged when it is larger than 3 percentage points (shares, savings) or
    10 % of the paper's value (concurrency).
    """
    rows = []
    paper = flatten(results["paper"])
    measured = flatten({k: results[k] for k in ("fig2", "fig13", "fig15")})
    for key, ours in measured.items():
        ref = paper.get(key)
        if ref is None or ours is None:
            rows.append({"key": key, "paper": ref, "kvsim": ours, "delta": None, "flag": False})
            continue
        delta = ours - ref
        if key.startswith("fig13."):
            flag = abs(delta) > 0.10 * abs(ref)
        else:
            flag = abs(delta) > 3.0
        rows.append({"key": key, "paper": ref, "kvsim": ours, "delta": round(delta, 2), "flag": flag})
    return rows


def ordering_checks(results: dict[str, Any]) -> dict[str, bool]:
    """The orderings the paper reports: Max < Pow2 < Oracle < vLLM (token states, concurrency)."""
    def increasing(values: list[float | None]) -> bool:
        return all(a is not None and b is not None and a < b for a, b in zip(values, values[1:]))

    checks = {"fig2.token_states": increasing([results["fig2"][s]["token_states"] for s in SYSTEMS])}
    for wl in results["fig13"]:
        checks[f"fig13.{wl}"] = increasing([results["fig13"][wl][s] for s in SYSTEMS])
    for m in FIG15_MODES:
        checks[f"fig15.{m}.grows_with_n"] = increasing([results["fig15"][m][str(n)] for n in FIG15_NS])
    checks["fig15.beam_above_parallel"] = all(
        (results["fig15"]["beam"][str(n)] or 0) > (results["fig15"]["parallel"][str(n)] or 0)
        for n in FIG15_NS)
    return checks


OUTPUT_NAMES = {"json": "results.json", "md": "report.md", "html": "report.html"}


def output_writes(results: dict[str, Any], out_dir: str | os.PathLike) -> list[tuple[Path, Any]]:
    """(path, write) for results.json, report.md and report.html in ``out_dir`` (not run yet)."""
    out = Path(out_dir)
    renders = {"json": lambda: json.dumps(results, indent=2, sort_keys=True, allow_nan=False) + "\n",
               "md": lambda: render_markdown(results), "html": lambda: render_html(results)}
    return [(out / OUTPUT_NAMES[kind], lambda path=out / OUTPUT_NAMES[kind], render=render:
             path.write_text(render())) for kind, render in renders.items()]


def write_outputs(results: dict[str, Any], out_dir: str | os.PathLike) -> dict[str, Path]:
    """Write results.json, report.md and report.html into ``out_dir`` (created if needed).

    Returns:
        {"json": path, "md": path, "html": path}.
    """
    prepare_output_dir(out_dir, names=tuple(OUTPUT_NAMES.values()))
    for _, write in output_writes(results, out_dir):
        write()
    return {kind: Path(out_dir) / name for kind, name in OUTPUT_NAMES.items()}

"""Trace loaders: stream a file into Requests, format sniffed from content (``format=`` overrides).

Formats (../shared/traces/SOURCES.md has the real files):

``mooncake``    JSONL, exactly the keys ``timestamp`` (ms), ``input_length``, ``output_length``,
                ``hash_ids`` (one prefix-chained id per 512 prompt tokens, so
                ``len(hash_ids) == ceil(input_length / 512)``). The prompt becomes one segment per
                id (the last one partial), which maps the ids to any block size as
                ``workloads.keys.rekey_blocks`` does; the whole prompt is shareable.
``azure``       CSV ``TIMESTAMP,ContextTokens,GeneratedTokens`` (Azure LLM inference traces
                2023/2024). TIMESTAMP is ``YYYY-MM-DD HH:MM:SS[.fffffff]``; fractions of any
                length are kept exactly (as integer 100 ns ticks) so equal or close times keep
                their order. Unique content.
``sharegpt``    CSV ``num_prefill_tokens,num_decode_tokens[,num_total_tokens,pd_ratio]``
                (Vidur / Sarathi-Serve length files). No timestamps: arrivals are a Poisson
                process at ``rate`` per second, seeded by ``seed`` (first request at 0), exactly
                the ``sharegpt:`` synthetic generator's arrival stream. Unique content.
``vllm-oracle`` CSV ``arrival_step,prompt_tokens,output_tokens[,prefix_group,prefix_len]
                [,request_id]`` (../shared/tools/vllm_oracle). The first ``prefix_len`` tokens
                (clipped to the prompt) of every request of a ``prefix_group`` are identical,
                the rest unique: segments ``[(group, prefix_len), (unique, rest)]``.
                ``arrival_s = float(arrival_step)``. Other columns are ignored, as the oracle
                ignores them; ``request_id`` must be an integer when given (default: row index).
``generic``     CSV or JSONL with a column mapping, ``generic:arrival=COL,prompt=COL,output=COL,
                time_unit=s|ms|us|ns|datetime,id=COL``. Plain ``generic`` maps ``arrival_s``,
                ``prompt_tokens``, ``output_tokens`` (and generates Poisson arrivals at ``rate``
                when there is no ``arrival_s`` column); an explicit mapping without ``arrival``
                does the same. Unmapped columns are ignored. Unique content.

Every format: arrival times are relative to the first request; times must not go backwards
(ties keep file order); lengths are integers (``12.0`` accepted), prompt and output >= 1.
Fixed-schema formats (mooncake, azure, sharegpt) reject unknown columns/keys, naming them,
so a wrong format choice never loads silently. Errors are ``InputError`` naming file, line and
field; tolerances (BOM, CRLF, blank lines, gzip) are in ``workloads.reading``.
"""
from __future__ import annotations

import csv
import datetime
import functools
import json
import re
from collections.abc import Iterator

from kvsim.errors import InputError, json_problem
from kvsim.workloads.arrivals import Poisson, arrival_times, seed_streams
from kvsim.workloads.reading import (check_text_file, first_data_line, iter_lines, parse_count,
                               parse_number)
from kvsim.workloads.request import NS_GROUP, NS_PROMPT, Request, derived_id, label_id
from kvsim.workloads.spec import parse_spec, plain

FORMATS = ("mooncake", "azure", "sharegpt", "vllm-oracle", "generic")
MOONCAKE_BLOCK_TOKENS = 512
_MOONCAKE_KEYS = ("timestamp", "input_length", "output_length", "hash_ids")
_AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
_SHAREGPT_COLUMNS = ("num_prefill_tokens", "num_decode_tokens", "num_total_tokens", "pd_ratio")
_ORACLE_COLUMNS = ("arrival_step", "prompt_tokens", "output_tokens")
_GENERIC_DEFAULT = {"arrival": "arrival_s", "prompt": "prompt_tokens", "output": "output_tokens"}
_TIME_UNITS_S = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}
_DATETIME = re.compile(
    r"\s*(\d{4})-(\d{2})-(\d{2})[ T](\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,9}))?\s*\Z")


# ----------------------------------------------------------------------------- helpers
@functools.lru_cache(maxsize=64)
def _day_ordinal(year: str, month: str, day: str) -> int:
    """Proleptic Gregorian ordinal of a date (ValueError if it does not exist); a trace's rows
    share a few dates, so they are computed once each."""
    return datetime.date(int(year), int(month), int(day)).toordinal()


def parse_datetime_ticks(text: str, *, file: str, line: int, field: str) -> int:
    """``YYYY-MM-DD HH:MM:SS[.fraction]`` (no zone) as integer 100 ns ticks.

    ``strptime('%f')`` takes at most 6 fraction digits and Azure writes 7; integer ticks keep
    every digit (up to 7; more are truncated), so the file order of close times is preserved.
    """
    m = _DATETIME.match(text)
    if not m:
        raise InputError(f"bad timestamp {text!r}: expected YYYY-MM-DD HH:MM:SS[.fffffff]",
                         file=file, line=line, field=field)
    y, mo, d, h, mi, s, frac = m.groups()
    try:
        days = _day_ordinal(y, mo, d)
    except ValueError as err:
        raise InputError(f"bad timestamp {text!r}: {err}", file=file, line=line,
                         field=field) from None
    if int(h) > 23 or int(mi) > 59 or int(s) > 60:
        raise InputError(f"bad timestamp {text!r}: time out of range", file=file, line=line,
                         field=field)
    seconds = ((days * 24 + int(h)) * 60 + int(mi)) * 60 + int(s)
    return seconds * 10_000_000 + int((frac or "0")[:7].ljust(7, "0"))


class _Clock:
    """Arrival times relative to the first request, checked not to go backwards."""

    def __init__(self, file: str, field: str, unit_s: float):
        self.file, self.field, self.unit_s = file, field, unit_s
        self.first = self.last = self.last_text = None

    def __call__(self, value, line: int, text: str | None = None) -> float:
        """Seconds since the first request; ``text``: how the value is written (errors)."""
        if self.first is None:
            self.first = value
        elif value < self.last:
            raise InputError(f"time goes backwards: {text or value} after "
                             f"{self.last_text or self.last} (the trace must be sorted by "
                             "arrival; equal times keep file order)",
                             file=self.file, line=line, field=self.field)
        self.last, self.last_text = value, text
        return (value - self.first) * self.unit_s


def _poisson_arrivals(rate: float | None, seed: int, file: str, fmt: str) -> Iterator[float]:
    if rate is None:
        raise InputError(f"{fmt} trace has no timestamps: pass a rate (requests/s) to "
                         "generate Poisson arrivals", file=file, field="rate")
    if not rate > 0:
        raise InputError(f"rate must be > 0, got {rate}", file=file, field="rate")
    return arrival_times(Poisson(rate), seed_streams(seed)[0])


def _no_rate(rate: float | None, file: str, fmt: str) -> None:
    if rate is not None:
        raise InputError(f"{fmt} trace has its own timestamps; rate applies only to traces "
                         "without them", file=file, field="rate")


def _csv_rows(path: str, required: tuple[str, ...], fixed: tuple[str, ...] | None,
              fmt: str) -> Iterator[tuple[int, dict[str, str]]]:
    """Yield ``(line, {column: text})`` for each data row of a CSV file.

    Args:
        required: columns that must be in the header.
        fixed: if given, the only columns allowed (others are an error naming them).
    """
    reader = csv.reader((line for _, line in iter_lines(path)), strict=True)
    header = None
    try:
        for row in reader:
            if not row or all(not f.strip() for f in row):
                continue  # blank line: holds no request (documented tolerance)
            line = reader.line_num
            if header is None:
                header = [f.strip() for f in row]
                seen = set()
                for col in header:
                    if col in seen:
                        raise InputError("column appears twice in the header", file=path,
                                         line=line, field=col)
                    seen.add(col)
                for col in required:
                    if col not in seen:
                        raise InputError(f"missing column for the {fmt} format (header: "
                                         f"{','.join(header)})", file=path, line=line,
                                         field=col)
                if fixed is not None:
                    for col in header:
                        if col not in fixed:
                            raise InputError(f"unexpected column for the {fmt} format "
                                             f"(expected {','.join(fixed)})", file=path,
                                             line=line, field=col)
                continue
            if len(row) != len(header):
                hint = " (truncated line?)" if len(row) < len(header) else ""
                raise InputError(f"expected {len(header)} fields ({','.join(header)}), got "
                                 f"{len(row)}{hint}", file=path, line=line)
            yield line, dict(zip(header, row))
    except csv.Error as err:
        raise InputError(f"bad CSV: {err}", file=path, line=reader.line_num) from None
    if header is None:
        raise InputError("empty file: no requests", file=path)


def _json_rows(path: str) -> Iterator[tuple[int, dict]]:
    """Yield ``(line, object)`` for each non-blank line of a JSONL file."""
    for line, text in iter_lines(path):
        if not text.strip():
            continue
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as err:
            hint = "" if text.endswith("\n") else " (truncated last line?)"
            raise InputError(f"invalid JSON: {json_problem(err)}{hint}", file=path, line=line) from None
        if not isinstance(obj, dict):
            raise InputError(f"expected a JSON object, got {type(obj).__name__}", file=path,
                             line=line)
        yield line, obj


# ----------------------------------------------------------------------------- formats
def load_mooncake(path: str, *, rate: float | None = None, seed: int = 0) -> Iterator[Request]:
    """Mooncake JSONL (format in the module docstring)."""
    _no_rate(rate, path, "mooncake")
    return _iter_mooncake(path)


def _iter_mooncake(path: str) -> Iterator[Request]:
    clock = _Clock(path, "timestamp", 1e-3)
    request_id = 0
    for line, obj in _json_rows(path):
        for key in _MOONCAKE_KEYS:
            if key not in obj:
                raise InputError("missing key for the mooncake format", file=path, line=line,
                                 field=key)
        if len(obj) != len(_MOONCAKE_KEYS):
            extra = next(k for k in obj if k not in _MOONCAKE_KEYS)
            raise InputError(f"unexpected key for the mooncake format (expected "
                             f"{', '.join(_MOONCAKE_KEYS)})", file=path, line=line, field=extra)
        arrival_s = clock(parse_number(obj["timestamp"], file=path, line=line,
                                       field="timestamp"), line)
        prompt = parse_count(obj["input_length"], minimum=1, file=path, line=line,
                             field="input_length")
        output = parse_count(obj["output_length"], minimum=1, file=path, line=line,
                             field="output_length")
        ids = obj["hash_ids"]
        if not isinstance(ids, list) or not all(
                isinstance(i, int) and not isinstance(i, bool) for i in ids):
            raise InputError("expected a list of integers", file=path, line=line,
                             field="hash_ids")
        num_ids = -(-prompt // MOONCAKE_BLOCK_TOKENS)
        if len(ids) != num_ids:
            raise InputError(f"{len(ids)} ids for input_length {prompt}: expected "
                             f"ceil({prompt}/{MOONCAKE_BLOCK_TOKENS}) = {num_ids}", file=path,
                             line=line, field="hash_ids")
        # one segment per 512-token id, the last one partial: allocator block i (last token t)
        # is then keyed by (hash_ids[t // 512], t % 512) at any block size (DESIGN.md)
        last = prompt - (num_ids - 1) * MOONCAKE_BLOCK_TOKENS
        segments = tuple((i, MOONCAKE_BLOCK_TOKENS) for i in ids[:-1]) + ((ids[-1], last),)
        yield Request(request_id=request_id, arrival_s=arrival_s, prompt_tokens=prompt,
                      output_tokens=output, segments=segments, num_shareable_tokens=prompt)
        request_id += 1
    if clock.first is None:
        raise InputError("empty file: no requests", file=path)


def load_azure(path: str, *, rate: float | None = None, seed: int = 0) -> Iterator[Request]:
    """Azure LLM inference CSV (format in the module docstring)."""
    _no_rate(rate, path, "azure")
    return _iter_azure(path)


def _iter_azure(path: str) -> Iterator[Request]:
    clock = _Clock(path, "TIMESTAMP", 1e-7)
    for request_id, (line, row) in enumerate(
            _csv_rows(path, _AZURE_COLUMNS, _AZURE_COLUMNS, "azure")):
        ticks = parse_datetime_ticks(row["TIMESTAMP"], file=path, line=line, field="TIMESTAMP")
        yield Request(
            request_id=request_id, arrival_s=clock(ticks, line, row["TIMESTAMP"].strip()),
            prompt_tokens=parse_count(row["ContextTokens"], minimum=1, file=path, line=line,
                                      field="ContextTokens"),
            output_tokens=parse_count(row["GeneratedTokens"], minimum=1, file=path, line=line,
                                      field="GeneratedTokens"))
    if clock.first is None:
        raise InputError("no requests (header only)", file=path)


def load_sharegpt(path: str, *, rate: float | None = None, seed: int = 0) -> Iterator[Request]:
    """ShareGPT length CSV with Poisson arrivals at ``rate`` (format in the module docstring)."""
    return _iter_sharegpt(path, _poisson_arrivals(rate, seed, path, "sharegpt"))


def _iter_sharegpt(path: str, arrivals: Iterator[float]) -> Iterator[Request]:
    request_id = -1
    for request_id, (line, row) in enumerate(
            _csv_rows(path, _SHAREGPT_COLUMNS[:2], _SHAREGPT_COLUMNS, "sharegpt")):
        prompt = parse_count(row["num_prefill_tokens"], minimum=1, file=path, line=line,
                             field="num_prefill_tokens")
        output = parse_count(row["num_decode_tokens"], minimum=1, file=path, line=line,
                             field="num_decode_tokens")
        if "num_total_tokens" in row:
            total = parse_count(row["num_total_tokens"], minimum=2, file=path, line=line,
                                field="num_total_tokens")
            if total != prompt + output:
                raise InputError(f"{total} != num_prefill_tokens + num_decode_tokens = "
                                 f"{prompt + output}", file=path, line=line,
                                 field="num_total_tokens")
        yield Request(request_id=request_id, arrival_s=next(arrivals), prompt_tokens=prompt,
                      output_tokens=output)
    if request_id < 0:
        raise InputError("no requests (header only)", file=path)


def load_vllm_oracle(path: str, *, rate: float | None = None,
                     seed: int = 0) -> Iterator[Request]:
    """vllm-oracle trace CSV (format in the module docstring)."""
    _no_rate(rate, path, "vllm-oracle")
    return _iter_vllm_oracle(path)


def _iter_vllm_oracle(path: str) -> Iterator[Request]:
    clock = _Clock(path, "arrival_step", 1.0)
    seen_ids: set[int] = set()  # the oracle rejects duplicate ids; so do we
    for row_index, (line, row) in enumerate(
            _csv_rows(path, _ORACLE_COLUMNS, None, "vllm-oracle")):
        step = parse_count(row["arrival_step"], minimum=0, file=path, line=line,
                           field="arrival_step")
        clock(step, line)
        prompt = parse_count(row["prompt_tokens"], minimum=1, file=path, line=line,
                             field="prompt_tokens")
        output = parse_count(row["output_tokens"], minimum=1, file=path, line=line,
                             field="output_tokens")
        raw_id = (row.get("request_id") or "").strip()
        request_id = (parse_count(raw_id, minimum=0, file=path, line=line, field="request_id")
                      if raw_id else row_index)
        if request_id in seen_ids:
            raise InputError(f"duplicate request_id {request_id}", file=path, line=line,
                             field="request_id")
        seen_ids.add(request_id)
        group = (row.get("prefix_group") or "").strip()
        raw_len = (row.get("prefix_len") or "").strip()
        prefix = 0
        if group and raw_len:
            prefix = min(prompt, parse_count(raw_len, minimum=0, file=path, line=line,
                                             field="prefix_len"))
        segments: tuple[tuple[int, int], ...] = ()
        if prefix:
            segments = ((label_id(NS_GROUP, group), prefix),)
            if prompt > prefix:
                segments += ((derived_id(NS_PROMPT, request_id), prompt - prefix),)
        yield Request(request_id=request_id, arrival_s=float(step), prompt_tokens=prompt,
                      output_tokens=output, segments=segments, num_shareable_tokens=prefix,
                      arrival_step=step)
    if clock.first is None:
        raise InputError("no requests (header only)", file=path)


def load_generic(path: str, mapping: str = "generic", *, rate: float | None = None,
                 seed: int = 0) -> Iterator[Request]:
    """CSV or JSONL with a column mapping (``generic:arrival=COL,...``; module docstring)."""
    spec = parse_spec(mapping)
    spec.check_keys({"arrival", "prompt", "output", "time_unit", "id"})
    cols = {k: plain(spec, k) for k in spec.params if k != "time_unit"}
    explicit = bool(spec.params)
    for key, default in _GENERIC_DEFAULT.items():
        if key != "arrival" or not explicit:
            cols.setdefault(key, default)
    unit = plain(spec, "time_unit") if "time_unit" in spec.params else "s"
    if unit != "datetime" and unit not in _TIME_UNITS_S:
        raise spec.error("time_unit", f"unknown unit {unit!r}; expected "
                                      f"{', '.join(_TIME_UNITS_S)} or datetime")
    _, first = first_data_line(path)
    is_json = first.lstrip().startswith("{")
    if is_json:
        rows = _json_rows(path)
    else:
        header = next(csv.reader([first]))
        if not explicit and "arrival_s" not in [c.strip() for c in header]:
            cols.pop("arrival")  # plain 'generic' without arrival_s: Poisson arrivals
        required = tuple(cols[k] for k in ("arrival", "prompt", "output", "id") if k in cols)
        rows = _csv_rows(path, required, None, "generic")
    if "arrival" in cols:
        _no_rate(rate, path, "generic")
        clock = _Clock(path, cols["arrival"], 1e-7 if unit == "datetime" else _TIME_UNITS_S[unit])
        arrivals = None
    else:
        clock = None
        arrivals = _poisson_arrivals(rate, seed, path, "generic")
    return _iter_generic(path, rows, cols, unit, is_json, clock, arrivals)


def _iter_generic(path, rows, cols, unit, is_json, clock, arrivals) -> Iterator[Request]:
    request_id = -1
    seen_ids: set[int] = set()
    for request_id, (line, row) in enumerate(rows):
        for key, col in cols.items():
            if col not in row:
                raise InputError(f"missing {'key' if is_json else 'column'} mapped to {key}",
                                 file=path, line=line, field=col)
        if clock is None:
            arrival_s = next(arrivals)
        elif unit == "datetime":
            text = str(row[cols["arrival"]]).strip()
            arrival_s = clock(parse_datetime_ticks(text, file=path, line=line,
                                                   field=cols["arrival"]), line, text)
        else:
            arrival_s = clock(parse_number(row[cols["arrival"]], file=path, line=line,
                                           field=cols["arrival"]), line)
        rid = request_id
        if "id" in cols:
            rid = parse_count(row[cols["id"]], minimum=0, file=path, line=line, field=cols["id"])
            if rid in seen_ids:
                raise InputError(f"duplicate id {rid}", file=path, line=line, field=cols["id"])
            seen_ids.add(rid)
        yield Request(
            request_id=rid, arrival_s=arrival_s,
            prompt_tokens=parse_count(row[cols["prompt"]], minimum=1, file=path, line=line,
                                      field=cols["prompt"]),
            output_tokens=parse_count(row[cols["output"]], minimum=1, file=path, line=line,
                                      field=cols["output"]))
    if request_id < 0:
        raise InputError("no requests", file=path)


_LOADERS = {"mooncake": load_mooncake, "azure": load_azure, "sharegpt": load_sharegpt,
            "vllm-oracle": load_vllm_oracle}


def sniff_format(path: str) -> str:
    """The format of a trace file, from its first non-blank line.

    Raises:
        InputError: the content matches no known format (the message lists the formats).
    """
    line, first = first_data_line(path)
    if first.lstrip().startswith("{"):
        try:
            keys = set(json.loads(first))
        except (json.JSONDecodeError, TypeError):
            raise InputError("first line looks like JSON but does not parse", file=path,
                             line=line) from None
        if "hash_ids" in keys or "input_length" in keys:
            return "mooncake"
        if {"prompt_tokens", "output_tokens"} <= keys:
            return "generic"
        found = ", ".join(sorted(keys))
    else:
        try:
            cols = {c.strip() for c in next(csv.reader([first]))}
        except csv.Error as err:
            raise InputError(f"bad CSV header: {err}", file=path, line=line) from None
        if {"TIMESTAMP", "ContextTokens", "GeneratedTokens"} & cols:
            return "azure"
        if {"num_prefill_tokens", "num_decode_tokens"} & cols:
            return "sharegpt"
        if "arrival_step" in cols:
            return "vllm-oracle"
        if {"prompt_tokens", "output_tokens"} <= cols:
            return "generic"
        found = first.strip()[:120]
    raise InputError(f"unrecognised trace format (first line: {found}); pass a format: "
                     f"{', '.join(FORMATS)} or generic:arrival=COL,prompt=COL,output=COL",
                     file=path, line=line)


def load_file(path, format: str | None = None, *, rate: float | None = None,
              seed: int = 0) -> Iterator[Request]:
    """Stream the Requests of a trace file.

    Args:
        path: the trace file (plain or gzip-compressed).
        format: one of FORMATS or ``generic:...``; None sniffs it from the content.
        rate: arrivals per second, for formats without timestamps (sharegpt, generic without
            an arrival column); an error for the others.
        seed: seed of those generated arrivals.
    Returns:
        An iterator of Requests in arrival order; errors (InputError) surface while iterating,
        except file-level ones (missing, empty, binary, unknown format) which are raised here.
    """
    name = check_text_file(path)
    fmt = sniff_format(name) if format is None else format.strip()
    if fmt.split(":", 1)[0] == "generic":
        return load_generic(name, fmt, rate=rate, seed=seed)
    if fmt not in _LOADERS:
        raise InputError(f"unknown format {fmt!r}; expected one of {', '.join(FORMATS)} "
                         "(generic takes a mapping: generic:arrival=COL,prompt=COL,output=COL)",
                         field="format")
    return _LOADERS[fmt](name, rate=rate, seed=seed)

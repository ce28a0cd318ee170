"""Run many vLLM-oracle jobs in ONE process (vLLM's imports, about 6 s, are paid once).

Runs under the oracle's venv, not kvsim's: `ORACLE_PY bench/oracle_batch.py ORACLE_DIR JOBS.json`.
JOBS.json is a list of {"argv": [oracle.py arguments]}, optionally with "kv_groups" (hybrid
KV-cache groups, bench/hybrid_oracle.py's --kv-groups) and "cpu_chunks" with
"transfer_steps_per_chunk" (CPU offloading, bench/offload_oracle.py); a job whose run fails (the oracle exits,
e.g. a request that can never fit) gets an `error` file in its --out-dir instead of outputs.
Each job builds a fresh Scheduler, so the results equal separate oracle runs.
"""
import json
import sys
from pathlib import Path


def main() -> int:
    oracle_dir, jobs_path = sys.argv[1], sys.argv[2]
    sys.path.insert(0, oracle_dir)
    import oracle  # noqa: E402  (the vLLM oracle driver)
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from bench.hybrid_oracle import hybrid_build_scheduler, parse_groups  # noqa: E402
    from bench.offload_oracle import run_offload  # noqa: E402

    single_group = oracle.build_scheduler
    for job in json.loads(Path(jobs_path).read_text()):
        argv = job["argv"]
        oracle.build_scheduler = single_group
        if job.get("kv_groups"):
            oracle.build_scheduler = hybrid_build_scheduler(oracle,
                                                            parse_groups(job["kv_groups"]))
        out_dir = Path(argv[argv.index("--out-dir") + 1])
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "error").unlink(missing_ok=True)  # from an earlier run of this job
        try:
            if job.get("cpu_chunks"):
                run_offload(oracle, argv, job["cpu_chunks"], job.get("transfer_steps_per_chunk", 1),
                            job.get("kv_groups"))
            else:
                oracle.main(argv)
        except SystemExit as stop:  # the oracle reports unfit input with sys.exit(message)
            (out_dir / "error").write_text(f"{stop.code}\n")
        except Exception as err:  # vLLM refused the configuration: that job only
            (out_dir / "error").write_text(f"vLLM: {type(err).__name__}: {err}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

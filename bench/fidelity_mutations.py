"""Does the golden fidelity suite have teeth? Break one vLLM rule at a time, see who notices.

Each mutation rewrites one line of a COPY of the simulator or allocator (in a temporary folder;
the working tree is never touched) so that it violates one rule of docs/FIDELITY.md, then runs
tests/test_fidelity_golden.py on the copy. A mutation no golden case catches means a rule the
fixtures do not pin down. A mutation whose source line has changed is reported as not applicable
(update the pattern here).

Usage: python bench/fidelity_mutations.py
"""
from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
COPIED = ["allocator", "simulator", "workloads", "planner", "bench", "pyproject.toml",
          "tests/conftest.py", "tests/test_fidelity_golden.py", "tests/fixtures/oracle"]

# (FIDELITY.md rule, what is broken, file, exact source text, replacement)
MUTATIONS = [
    ("4", "threshold applied to a lone request", "simulator/scheduler.py",
     "lpt = cfg.long_prefill_token_threshold if len(running) + len(self.waiting) > 1 else 0",
     "lpt = cfg.long_prefill_token_threshold"),
    ("7", "victim goes to the back of the waiting queue", "simulator/scheduler.py",
     "        self.waiting.appendleft(seq)", "        self.waiting.append(seq)"),
    ("7", "victim is the first running request", "simulator/scheduler.py",
     "victim = running.pop()", "victim = running.pop(0)"),
    ("8", "admissions in a step that preempted", "simulator/scheduler.py",
     "        if not preempted_any:", "        if True:"),
    ("10", "hit capped at num_tokens instead of num_tokens - 1", "allocator/paged.py",
     "for i in range(min((num_tokens - 1) // self.block_size, len(block_hashes))):",
     "for i in range(min(num_tokens // self.block_size, len(block_hashes))):"),
    ("12", "admission gate on the final length P + O instead of the current one",
     "simulator/scheduler.py", "full = min(num_tokens, cfg.max_model_len)",
     "full = min(seq.num_prompt_tokens + seq.max_output_tokens, cfg.max_model_len)"),
    ("12", "evictable hit blocks cost no free block", "allocator/paged.py",
     "- len(hits) + sum(ref[b] == 0 for b in hits)", "- len(hits)"),
    ("15", "watermark applied on an empty engine", "simulator/scheduler.py",
     "wm = self.watermark_blocks if self.running else 0", "wm = self.watermark_blocks"),
    ("16", "re-admissions counted as first-admission prefix queries", "simulator/scheduler.py",
     "if seq.num_preemptions > 0:", "if False:"),
    ("22", "a partial prefill chunk samples a token", "simulator/scheduler.py",
     "            if seq.num_computed_tokens < seq.num_tokens:\n"
     "                continue  # a partial prefill chunk samples nothing",
     "            if False:\n                continue"),
    ("20", "finished request freed without its pending decode tokens", "simulator/scheduler.py",
     "        self._sync(seq)\n        self.allocator.free(seq.seq_id, preempted=preempted)",
     "        if preempted:\n            self._sync(seq)\n"
     "        self.allocator.free(seq.seq_id, preempted=preempted)"),
    ("23", "max_model_len does not stop a request", "simulator/scheduler.py",
     "max_out = min(req.output_tokens, self.config.max_model_len - req.prompt_tokens)",
     "max_out = req.output_tokens"),
]


def main() -> int:
    num_caught = num_applied = 0
    with tempfile.TemporaryDirectory(prefix="kvsim-mutations-") as tmp:
        work = Path(tmp)
        for rel in COPIED:
            src, dst = ROOT / rel, work / rel
            dst.parent.mkdir(parents=True, exist_ok=True)
            if src.is_dir():
                shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__"))
            else:
                shutil.copy2(src, dst)
        for rule, what, rel, old, new in MUTATIONS:
            path = work / rel
            original = path.read_text()
            if old not in original:
                print(f"rule {rule:>2} {what}: not applicable (source changed)")
                continue
            num_applied += 1
            path.write_text(original.replace(old, new, 1))
            try:
                run = subprocess.run(
                    [sys.executable, "-m", "pytest", "-q", "-p", "no:xdist", "-p", "no:cacheprovider",
                     "tests/test_fidelity_golden.py", "-k", "reproduces"],
                    cwd=work, capture_output=True, text=True, timeout=600)
            finally:
                path.write_text(original)
            caught = [line.split("[", 1)[1].rstrip("]") for line in run.stdout.splitlines()
                      if line.startswith("FAILED") and "[" in line]
            num_caught += bool(caught)
            print(f"rule {rule:>2} {what}: "
                  + (f"caught by {len(caught)} case(s): {', '.join(caught)}" if caught
                     else "NOT CAUGHT"))
    print(f"{num_caught}/{num_applied} mutations caught")
    return 0 if num_caught == num_applied else 1


if __name__ == "__main__":
    sys.exit(main())

"""Forks: parallel sampling (``Request.n`` > 1) and beam search (``beam_width`` > 1).

The vLLM paper's block sharing (SOSP'23, sections 4.4 and 6.3), which vLLM v1 itself does not
have (it runs n > 1 samples as separate requests that share the prompt through the prefix
cache):

* A forked request is admitted as sample 0. After its prompt's first token, the other
  ``width - 1`` samples fork from it (``allocator.fork``: every block shared, ref counts + 1) and
  then decode on their own. Appending into a shared partial last block copies it first
  (copy-on-write, counted by ``KVSlots._grow``).
* Beams stay in lockstep. Each time they complete a block, the ``width`` beams are reselected:
  every new beam picks a parent uniformly at random (seeded per request); a beam nobody picked
  is freed and replaced by a fork of a picked one (the paper's Fig. 15 setting).

Forked sequences are inserted in the middle of ``running`` and share blocks, which the decode
clock does not model: the first forked request switches the clock off for the rest of the run.

``Forks`` is a mixin of ``scheduler.Scheduler``; it uses the host's ``allocator``,
``block_size``, ``prefix_caching``, ``seed``, ``running``, ``num_generated_tokens``,
``_new_seq_id``, the KV-slot mechanics (``_sync``, ``_free``) and the decode clock
(``clock``: its ``enabled`` and ``loose``, ``_unclock_all``).
"""
from __future__ import annotations

import random

from kvsim.simulator.seq_state import RUNNING, ForkGroup, SeqState


class Forks:
    """Parallel samples and beams (mixin; see the module docstring)."""

    def _start_fork_group(self, seq: SeqState, width: int) -> None:
        """A new request with ``width`` > 1 samples or beams becomes sample 0 of its ForkGroup."""
        req = seq.req
        if self.clock.enabled:
            # forks insert sequences in the middle of ``running`` and share blocks: step
            # every sequence one by one from now on
            self._unclock_all()
            self.clock.enabled = False
        kind = "beam" if (getattr(req, "beam_width", 1) or 1) > 1 else "sample"
        seq.group = ForkGroup(req.request_id, kind, width, [seq],
                              random.Random(self.seed * 1_000_003 + req.request_id))
        seq.plain = False

    def _fork_samples(self, parent: SeqState) -> None:
        """Parallel sampling / beam search start: after the prompt's first token, the other
        ``width - 1`` samples fork from sample 0, sharing all its blocks (the partial last block is
        copied on write by the allocator when a child appends). Children are inserted right after
        the parent in the running list (they were admitted with it) and then decode on their own;
        a preempted child recomputes its prompt + outputs like any request (vLLM v1 runs parallel
        samples as separate requests sharing the prompt through the prefix cache)."""
        group = parent.group
        idx = self.running.index(parent)
        self._sync(parent)
        for s in range(1, group.width):
            child = SeqState(seq_id=self._new_seq_id(), req=parent.req,
                             num_prompt_tokens=parent.num_prompt_tokens,
                             max_output_tokens=parent.max_output_tokens,
                             arrival_ns=parent.arrival_ns, status=RUNNING,
                             num_output_tokens=parent.num_output_tokens,
                             num_tokens=parent.num_tokens,
                             num_computed_tokens=parent.num_computed_tokens,
                             num_alloc_tokens=parent.num_alloc_tokens, eager=parent.eager,
                             plain=False,
                             group=group, sample=s, first_sched_ns=parent.first_sched_ns,
                             first_token_ns=parent.first_token_ns,
                             first_sched_step=parent.first_sched_step,
                             first_token_step=parent.first_token_step,
                             cached_tokens_first=parent.cached_tokens_first,
                             order=parent.order)
            if self.prefix_caching:
                child.keys = parent.req.block_keys(self.block_size, s)
            self.allocator.fork(parent.seq_id, child.seq_id, block_hashes=child.keys)
            group.members.append(child)
            self.running.insert(idx + s, child)
            loose = self.clock.loose
            loose.insert(loose.index(parent) + s, child)
            self.num_generated_tokens += 1   # each sample draws its own first token
            self.num_first_tokens += 1

    def _reselect_beams(self, group: ForkGroup) -> None:
        """Beam search model (the vLLM paper's Fig. 15 setting): each time the beams complete a
        block, the ``width`` beams are reselected: every new beam picks a parent beam uniformly at
        random (seeded per request); a beam nobody picked is dropped (its blocks freed), a beam
        picked k times continues and is forked k-1 times. Beams stay in lockstep (same length), so
        a reselection happens at a block boundary and children share every full block."""
        live = [m for m in group.members if m.status == RUNNING]
        if len(live) < 2 or any(m.num_computed_tokens != live[0].num_computed_tokens for m in live):
            return  # a beam was preempted: no reselection until they are in lockstep again
        picks = sorted(group.rng.randrange(len(live)) for _ in live)
        counts = [picks.count(i) for i in range(len(live))]
        dropped = [m for m, c in zip(live, counts) if c == 0]
        for victim in dropped:
            parent = live[next(i for i, c in enumerate(counts) if c > 1)]
            counts[live.index(parent)] -= 1
            # the dropped beam's slot is reused: free it, fork from the parent
            self._free(victim, preempted=False)
            self._sync(parent)
            self.allocator.fork(parent.seq_id, victim.seq_id, block_hashes=victim.keys)
            victim.num_computed_tokens = parent.num_computed_tokens
            victim.num_alloc_tokens = parent.num_alloc_tokens
            victim.num_output_tokens = parent.num_output_tokens
            victim.num_tokens = parent.num_tokens

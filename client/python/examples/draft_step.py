#!/usr/bin/env python3
"""A scheduler's draft step with the LM head moved to drafthead.

In an in-process speculative decoder the draft step ends with
    logits = hidden @ lm_head.weight.T          # [B, D, V] on the scheduler's GPU
    proposal = argmax(logits) (greedy) or a sample (temperature > 0)
Here the last two lines become one remote call: only the hidden states [B, D, K] go over the wire and
only the proposals come back (DSpark drafts D = 5 tokens per sequence, so a call carries B x 5 rows).

The draft trunk below is a stand-in (a fixed random embedding + mixing, numpy only) so the example
runs anywhere; a real scheduler passes its draft model's final hidden states, as a torch tensor or
numpy array, unchanged. With the drafthead_client wheel installed (docs/client.md):

    python3 client/python/examples/draft_step.py --target=127.0.0.1:50051 --sequences=4 --steps=3
"""

import argparse
import sys
import time

import numpy as np

from drafthead_client import RemoteDraftHead


class StandInDraftTrunk:
    """Maps each sequence's last token to D draft positions' hidden states [B, D, K]."""

    def __init__(self, vocab: int, hidden: int, depth: int, seed: int = 0):
        rng = np.random.default_rng(seed)
        self.embed = rng.standard_normal((vocab, hidden)).astype(np.float32)
        self.mix = (rng.standard_normal((depth, hidden, hidden)) / np.sqrt(hidden)).astype(np.float32)

    def __call__(self, last_tokens: np.ndarray) -> np.ndarray:
        x = self.embed[last_tokens % self.embed.shape[0]]           # [B, K]
        return np.tanh(np.einsum("bk,dkj->bdj", x, self.mix))        # [B, D, K]


def draft_step(head: RemoteDraftHead, trunk: StandInDraftTrunk, last_tokens: np.ndarray,
               temperature: float, seed: int) -> np.ndarray:
    """Proposes D tokens per sequence: [B, D] int32."""
    hidden = trunk(last_tokens)
    if temperature == 0.0:
        return head.argmax(hidden).ids                                 # replaces argmax(hidden @ W.T)
    return head.sample(hidden, temperature=temperature, seed=seed).ids  # replaces sampling from the logits


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", required=True)
    ap.add_argument("--sequences", type=int, default=4)
    ap.add_argument("--depth", type=int, default=5, help="draft tokens per sequence per step")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--wait", type=float, default=10.0, help="seconds to wait for the server to serve")
    args = ap.parse_args()

    with RemoteDraftHead(args.target) as head:
        head.wait_until_serving(args.wait)
        info = head.info()
        trunk = StandInDraftTrunk(info["vocab_size"], info["hidden_size"], args.depth)
        last = np.arange(args.sequences, dtype=np.int64)
        for step in range(args.steps):
            t0 = time.perf_counter()
            proposal = draft_step(head, trunk, last, args.temperature, seed=step)
            ms = (time.perf_counter() - t0) * 1e3
            assert proposal.shape == (args.sequences, args.depth)
            assert ((proposal >= 0) & (proposal < info["vocab_size"])).all()
            print(f"step {step}: {args.sequences * args.depth} rows in {ms:.2f} ms; "
                  f"proposals {proposal.tolist()}")
            # A real scheduler verifies the proposals with the target model here; we accept the last.
            last = proposal[:, -1].astype(np.int64)
    return 0


if __name__ == "__main__":
    sys.exit(main())

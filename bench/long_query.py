"""What a long query costs a cross-encoder's /rerank before anything reaches the model: the CPU seconds and the
engine's counted work of encoding one request of a query of N words x 40 documents of 100 words, truncated to
the model's length (``truncate_prompt_tokens: -1``), on the tiny test cross-encoder (its MiniLM tokenizer).

    python -m bench.long_query                 # 1,000, 100,000, 400,000 and 1,600,000 words
    python -m bench.long_query 5000 50000      # other lengths

Tokenizing is bounded by work, not by pairs (scorekit/models/tokens.py): the figure should stay flat as the
query grows. Before that change the same request cost 3.2 CPU seconds at 100,000 words and 14.5 at 400,000
(docs/benchmarks.md, "A long query's cost").
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch

from scorekit.models.cross_encoder import CrossEncoderBackend
from scorekit.models.files import Source
from scorekit.tasks import PairOptions
from tests.tiny_models import build_cross_encoder

DOCUMENTS = 40
DOCUMENT_WORDS = 100


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.long_query", description=__doc__.split("\n\n")[0])
    parser.add_argument("words", nargs="*", type=int, default=[1_000, 100_000, 400_000, 1_600_000])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        backend = CrossEncoderBackend(
            Source(str(build_cross_encoder(Path(folder)))), device=torch.device("cpu"), dtype=torch.float32
        )
        documents = [" ".join(f"d{(i * 7 + j) % 501}" for j in range(DOCUMENT_WORDS)) for i in range(DOCUMENTS)]
        print(f"{'query words':>12} {'MB':>6} {'CPU s':>8} {'work units':>11} {'inputs':>7}")
        for words in args.words:
            query = " ".join(f"w{i % 997}" for i in range(words))
            plan = backend.plan_pairs([query], documents, PairOptions(truncate=-1))
            work = 0

            def count(units: int) -> None:
                nonlocal work
                work += units

            started = time.process_time()
            encoded = plan.encode(count).inputs
            seconds = time.process_time() - started
            print(f"{words:>12,} {len(query) / 1e6:>6.2f} {seconds:>8.3f} {work:>11,} {len(encoded):>7}")


if __name__ == "__main__":
    main()

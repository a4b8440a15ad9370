"""mxbai-rerank-v2 (issue 33, item 3): a Qwen2 causal LM whose folder is named for it gets its preset with no flag,
and scores as mixedbread's MxbaiRerankV2 recipe, written out here from its published code on a tiny random Qwen2:
the chat prefix, "query: ..." (after "instruction: ...\\n" when one is given), "\\n", "document: ...", "\\n", the
task prompt and the assistant suffix, each tokenized apart; at the last position, the logit of "1" less that of
"0" (what its predict returns: ``use_activation: false``), and the two-way softmax, P("1"), as the score. To 1e-5,
through a served /rerank."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from scorekit.app import create_app
from scorekit.models import LLMRerankerBackend, detect_kind, load_backend
from scorekit.models.rerank_template import parse_template
from scorekit.settings import Settings
from tests.live import Live, serve
from tests.tiny_models import build_mxbai_reranker

PREFIX = (
    "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
    "<|im_start|>user\n"
)
TASK = (
    "You are a search relevance expert who evaluates how well documents match search queries. For each "
    "query-document pair, carefully analyze the semantic relationship between them, then provide your binary "
    "relevance judgment (0 for not relevant, 1 for relevant).\nRelevance:"
)
SUFFIX = "<|im_end|>\n<|im_start|>assistant\n"
QUERY = "What is the capital of France?"
DOCUMENTS = ["The capital of France is Paris.", "Bananas are yellow.", "Paris is a city in France with a river."]


@pytest.fixture(scope="module")
def mxbai_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_mxbai_reranker(tmp_path_factory.mktemp("models") / "mxbai-rerank-tiny-v2")


@pytest.fixture(scope="module")
def served(mxbai_dir: Path) -> Iterator[Live]:
    with serve(create_app(Settings.for_model(str(mxbai_dir), name="mxbai"))) as live:
        yield live


def _recipe(folder: Path, query: str, documents: list[str], instruction: str | None = None) -> list[float]:
    """MxbaiRerankV2's logits, its steps written out (short inputs: none of its truncation applies)."""
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    model = AutoModelForCausalLM.from_pretrained(str(folder)).eval()

    def ids(text: str) -> list[int]:
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])

    yes, no = ids("1")[0], ids("0")[0]
    query_prompt = f"query: {query}" if instruction is None else f"instruction: {instruction}\nquery: {query}"
    logits = []
    with torch.inference_mode():
        for document in documents:
            item = ids(query_prompt) + ids("\n") + ids(f"document: {document}")
            prompt = ids(PREFIX) + item + ids("\n") + ids(TASK) + ids(SUFFIX)
            last = model(torch.tensor([prompt])).logits[0, -1]
            logits.append(float(last[yes] - last[no]))
    return logits


def test_the_folder_s_name_makes_it_an_llm_reranker_with_the_mxbai_preset(mxbai_dir: Path) -> None:
    assert detect_kind(str(mxbai_dir)) == "llm-reranker"
    backend = load_backend(str(mxbai_dir))
    assert isinstance(backend, LLMRerankerBackend)
    assert backend.template.labels == ("0", "1") and backend.template.segments[-1] == SUFFIX


def test_scores_are_the_recipe_s_softmax_and_its_logits_without_activation(served: Live, mxbai_dir: Path) -> None:
    expected = _recipe(mxbai_dir, QUERY, DOCUMENTS)
    status, body = served.json("POST", "/rerank", {"query": QUERY, "documents": DOCUMENTS, "return_documents": False})
    assert status == 200, body
    scores = {item["index"]: item["relevance_score"] for item in body["results"]}
    for index, logit in enumerate(expected):
        assert scores[index] == pytest.approx(1 / (1 + torch.exp(torch.tensor(-logit)).item()), abs=1e-5)
    status, body = served.json("POST", "/score", {"queries": QUERY, "documents": DOCUMENTS, "use_activation": False})
    assert status == 200, body
    assert [item["score"] for item in body["data"]] == pytest.approx(expected, abs=1e-5)
    assert max(expected) - min(expected) > 1e-4  # the tiny model tells the documents apart


def test_an_instruction_is_its_own_line_before_the_query(served: Live, mxbai_dir: Path) -> None:
    instruction = "Find the passage that names the city."
    expected = _recipe(mxbai_dir, QUERY, DOCUMENTS, instruction)
    body = {"queries": QUERY, "documents": DOCUMENTS, "use_activation": False, "instruction": instruction}
    status, answer = served.json("POST", "/score", body)
    assert status == 200, answer
    assert [item["score"] for item in answer["data"]] == pytest.approx(expected, abs=1e-5)
    assert expected != pytest.approx(_recipe(mxbai_dir, QUERY, DOCUMENTS), abs=1e-6)  # the line changed them


def test_an_instruction_format_needs_its_slot_exactly_once() -> None:
    """A template's instruction_format names {instruction} once: none would drop the instruction, two repeat it."""
    base = {"segments": ["{instruction}query: {query}", "document: {document}"], "labels": ["0", "1"]}
    assert parse_template({**base, "instruction_format": "instruction: {instruction}\n"}, "t").instruction_format
    for bad in ("instruction:\n", "{instruction} {instruction}"):
        with pytest.raises(
            ValueError, match=r"t: A reranker template's instruction_format needs \{instruction\} exactly"
        ):
            parse_template({**base, "instruction_format": bad}, "t")
    with pytest.raises(ValueError, match="instruction and instruction_format must be strings"):
        parse_template({**base, "instruction_format": 3}, "t")

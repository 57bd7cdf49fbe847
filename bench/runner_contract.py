"""What each runner says to the same bad input (run by hand): a tiny BERT exported with ``dynamic=True`` on the three
backends, then fed each mistake of the input contract; prints the error class and first line per backend, and the
index check's cost on three tiny models.

    .venv/bin/python bench/runner_contract.py [--cost]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

BACKENDS = ("dynamo", "onnx", "executorch")


def tiny_bert():
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    config = BertConfig(vocab_size=64, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=32, max_position_embeddings=64)
    model = BertModel(config).eval()
    inputs = {"input_ids": torch.randint(0, 64, (2, 7)), "attention_mask": torch.ones(2, 7, dtype=torch.long)}
    return model, inputs


def export_all(model, inputs, folder: Path) -> dict:
    from engine import AutoExporter, load_artifact, save_artifact
    from engine.artifacts import SUFFIX

    artifacts = {}
    for backend in BACKENDS:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            artifact = AutoExporter.export(model, inputs, {"export_format": backend, "dynamic": True})
        artifacts[backend] = load_artifact(save_artifact(artifact, folder / f"bert{SUFFIX[backend]}"))
    return artifacts


def mistakes(inputs: dict) -> dict[str, dict]:
    ids, mask = inputs["input_ids"], inputs["attention_mask"]
    return {
        "unknown key": {**inputs, "token_typo": ids},
        "missing key": {"input_ids": ids},
        "float ids": {**inputs, "input_ids": ids.float()},
        "int32 ids": {**inputs, "input_ids": ids.int()},
        "wrong rank": {**inputs, "input_ids": ids[0]},
        "length above bounds": {"input_ids": torch.zeros(2, 500, dtype=torch.long),
                                "attention_mask": torch.ones(2, 500, dtype=torch.long)},
        "length 0": {"input_ids": ids[:, :0], "attention_mask": mask[:, :0]},
        "negative id": {**inputs, "input_ids": torch.where(ids == ids[0, 0], -1, ids)},
        "id past the vocabulary": {**inputs, "input_ids": ids + 64},
        "list ids": {**inputs, "input_ids": ids.tolist()},
        "string ids": {**inputs, "input_ids": "hello"},
    }


def outcome(artifact, inputs) -> str:
    from engine import run_exported

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            run_exported(artifact, inputs)
    except Exception as e:  # noqa: BLE001 - what the runner raises is the measurement
        first = (str(e).strip().splitlines() or [""])[0]
        return f"{type(e).__name__}: {first[:110]}"
    return "an output (no error)"


def table(artifacts: dict, inputs: dict) -> None:
    for mistake, bad in mistakes(inputs).items():
        print(f"## {mistake}")
        for backend in BACKENDS:
            print(f"  {backend:<11} {outcome(artifacts[backend], bad)}")


def cost(repeats: int = 300) -> None:
    """The index check's own time (finding the index inputs, cached per program, and checking their values) against
    ``run_exported``'s, medians over ``repeats`` calls, on three tiny models' dynamo programs: timing the whole run
    with and without the check measures the run's noise (+-15 %), not the check."""
    import statistics

    from transformers import GPT2Config, GPT2LMHeadModel, T5Config, T5EncoderModel

    from engine import DynamoExporter, run_exported
    from engine.index_inputs import check_index_values, find_index_inputs
    from engine.pytree import get_leaf_tensors

    torch.manual_seed(0)
    models = {
        "bert": tiny_bert(),
        "gpt2": (GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=64, bos_token_id=0,
                                            eos_token_id=0)).eval(), {"input_ids": torch.randint(0, 64, (2, 7))}),
        "t5-encoder": (T5EncoderModel(T5Config(vocab_size=64, d_model=16, d_kv=8, d_ff=32, num_layers=1,
                                               num_heads=2)).eval(), {"input_ids": torch.randint(0, 64, (2, 7))}),
    }

    def median_seconds(call) -> float:
        times = []
        for _ in range(repeats):
            started = time.perf_counter()
            call()
            times.append(time.perf_counter() - started)
        return statistics.median(times)

    for name, (model, inputs) in models.items():
        program = DynamoExporter().export(model, inputs, config={"dynamic": True})
        leaves = get_leaf_tensors(inputs)
        run = median_seconds(lambda: run_exported(program, inputs))
        check = median_seconds(lambda: check_index_values(name, find_index_inputs(program), leaves))
        print(f"{name:<11} run_exported {1e3 * run:.2f} ms; the index check {1e6 * check:.0f} us "
              f"({100 * check / run:.2f} % of the run; inputs checked: {', '.join(find_index_inputs(program))})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cost", action="store_true", help="also time the index check on three tiny models")
    args = parser.parse_args()
    torch.set_num_threads(1)
    model, inputs = tiny_bert()
    with tempfile.TemporaryDirectory() as folder:
        table(export_all(model, inputs, Path(folder)), inputs)
    if args.cost:
        cost()


if __name__ == "__main__":
    main()

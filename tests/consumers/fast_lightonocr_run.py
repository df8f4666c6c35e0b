"""Runs an ocrctl export with fast-lightonocr (PyPI) unchanged, as a user would (issue 16).

    python fast_lightonocr_run.py EXPORT_DIR [PRESET...]     PRESET: default | fp16 | q4 (all three by default)

Greedy decoding (do_sample=False, 40 tokens) on the five fixture images. fast-lightonocr always
stops at EOS and does not expose its prompt ids, so the check is: the generated ids equal the
expected ids up to and including the first EOS (golden.json `greedy_ids` for default/fp16,
int4_expected.json `int4_greedy_ids` for q4). Prints one JSON line per image (or per failed
load); exit status 0 iff everything loaded and matched.
"""

import json
import sys
from pathlib import Path

from fast_lightonocr import LightOnOCR

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "tiny-lightonocr"


def expected():
    golden = json.loads((FIXTURE / "golden" / "golden.json").read_text())
    int4 = json.loads((FIXTURE / "int4_expected.json").read_text())
    eos = set(golden["eos_token_ids"])
    int4_ids = {im["file"]: im["int4_greedy_ids"] for im in int4["images"]}

    def until_eos(ids):
        n = next((i for i, t in enumerate(ids) if t in eos), len(ids) - 1)
        return ids[: n + 1]

    return {
        im["file"]: {
            "default": until_eos(im["greedy_ids"]),
            "fp16": until_eos(im["greedy_ids"]),
            "q4": until_eos(int4_ids[im["file"]]),
        }
        for im in golden["images"]
    }


def main():
    export = Path(sys.argv[1])
    presets = sys.argv[2:] or ["default", "fp16", "q4"]
    want = expected()
    ok = True
    for preset in presets:
        try:
            model = LightOnOCR.from_pretrained(
                export,
                preset=preset,
                generation_kwargs={"do_sample": False, "max_new_tokens": 40},
                runtime_kwargs={"execution_provider": "cpu"},
            )
        except Exception as e:  # noqa: BLE001 - the error text is the result
            ok = False
            print(json.dumps({"preset": preset, "stage": "load", "error": f"{type(e).__name__}: {e}"}))
            continue
        for file, exp in want.items():
            try:
                got = list(model.process(FIXTURE / file).token_ids)
            except Exception as e:  # noqa: BLE001
                ok = False
                print(json.dumps({"preset": preset, "image": file, "error": f"{type(e).__name__}: {e}"}))
                continue
            match = got == exp[preset]
            ok &= match
            print(json.dumps({"preset": preset, "image": file, "greedy_match": match,
                              "generated_ids": got, "expected_ids": exp[preset]}))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()

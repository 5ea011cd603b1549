"""Parts of the vLLM backend that need no vllm (run in the default suite): prompt validation with
the native engine's errors, and that the native path never loads vllm."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from inference_svc.engine.engine import EngineInputError, PromptTooLongError
from inference_svc.engine.request import Segment
from inference_svc.vllm_backend.install import project_requirements
from inference_svc.vllm_backend.prompt import PromptLimits, StreamedPrompt


class CharTokenizer:
    def encode(self, text, add_special_tokens=False):
        return [ord(c) % 100 for c in text]

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(i) for i in ids)


def prompt(limit_tokens: int = 20) -> StreamedPrompt:
    from inference_svc.engine.tokenization import SegmentTokenizer

    return StreamedPrompt(SegmentTokenizer(CharTokenizer()), PromptLimits(100, 1000, limit_tokens + 1))


def test_append_update_finish_track_tokens_and_lcp():
    p = prompt()
    assert p.open([Segment(text="ab")]) == [97, 98]
    assert p.append([Segment(text="cd", key="d1")]) == [99, 0]
    assert p.update([Segment(text="cx")]) == 3          # head "ab" + "c" survive
    assert p.finish([Segment(text="!")]) == [33]
    assert p.tokens == [97, 98, 99, 20, 33]


@pytest.mark.parametrize(("action", "error", "fragment"), [
    (lambda p: p.append([Segment(token_ids=(100,))]), EngineInputError, "token ids must be in [0, 100)"),
    (lambda p: p.append([Segment(text="x" * 30)]), PromptTooLongError, "prompt too long: 32 tokens; the limit is 20"),
    (lambda p: p.update([Segment(text="x" * 30)]), PromptTooLongError, "prompt too long: 32 tokens; the limit is 20"),
    (lambda p: p.finish([Segment(token_ids=(-1,))]), EngineInputError, "token ids must be in"),
])
def test_bad_input_raises_the_engines_errors_and_changes_nothing(action, error, fragment):
    p = prompt()
    p.open([Segment(text="ab")])
    with pytest.raises(error, match=fragment.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
        action(p)
    assert p.tokens == [97, 98]


def test_empty_prompt_is_rejected_at_finish():
    p = prompt()
    p.open([])
    with pytest.raises(EngineInputError, match="the prompt is empty"):
        p.finish([Segment(text="")])


def test_installer_leaves_transformers_to_vllm():
    requirements = project_requirements()
    assert requirements and not any(r.startswith("transformers") for r in requirements)
    assert any(r.startswith("sentence-transformers") for r in requirements)


def test_native_paths_do_not_import_vllm():
    code = ("import sys; import inference_svc.server, load_tests.engine_bench, streamrag.stack.commands, "
            "inference_svc.launch; "
            "loaded = [m for m in sys.modules if m == 'vllm' or m.startswith('vllm.') "
            "or m in ('inference_svc.vllm_backend.engine', 'inference_svc.vllm_backend.service')]; "
            "assert not loaded, loaded")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_speculation_maps_to_vllms_ngram_speculative_config():
    from inference_svc.vllm_backend.config import AUTO_NGRAM_DEPTH, VllmSpec, speculative_config

    assert speculative_config("off") is None and speculative_config("0") is None
    assert speculative_config("8") == {"method": "ngram", "num_speculative_tokens": 8,
                                       "prompt_lookup_min": 2, "prompt_lookup_max": 4}
    assert speculative_config("auto")["num_speculative_tokens"] == AUTO_NGRAM_DEPTH   # vLLM's depth is fixed
    assert speculative_config(VllmSpec(model_dir="m").speculation) is None     # off unless asked
    with pytest.raises(ValueError, match="speculation"):
        speculative_config("17")


SPOOL_CHILD = ("import sys, time; from pathlib import Path; "
               "from inference_svc.vllm_backend.kv_spool import default_spool_root; "
               "print(default_spool_root(Path(sys.argv[1])), flush=True); time.sleep(120)")


def spool_of_a_child(base) -> tuple[subprocess.Popen, Path]:
    """A process that made a spool directory under `base` (as a replica does) and keeps running."""
    child = subprocess.Popen([sys.executable, "-c", SPOOL_CHILD, str(base)], stdout=subprocess.PIPE, text=True)
    return child, Path(child.stdout.readline().strip())


def test_start_up_removes_only_the_spools_whose_owner_is_gone(tmp_path):
    from inference_svc.vllm_backend.kv_spool import OWNER_FILE, default_spool_root, remove_stale_spools

    killed, stale = spool_of_a_child(tmp_path)
    live, kept = spool_of_a_child(tmp_path)
    try:
        (stale / "ship" / "1-0").mkdir(parents=True)            # a SIGKILLed replica leaves its files behind
        (stale / "ship" / "1-0" / "000000000.kv").write_bytes(b"kv")
        killed.kill()
        killed.wait()
        mine = default_spool_root(tmp_path)
        unowned = tmp_path / "streamrag-kv-unowned"              # being made now, or made by an older version
        unowned.mkdir()
        reused = default_spool_root(tmp_path)                   # this pid, another start time: a reused pid
        pid, started = (reused / OWNER_FILE).read_text().split()
        (reused / OWNER_FILE).write_text(f"{pid} {int(started) - 1}\n")
        (tmp_path / "other-folder").mkdir()

        assert remove_stale_spools(tmp_path) == sorted([stale, reused])
        assert not stale.exists() and not reused.exists()
        assert kept.is_dir() and mine.is_dir() and unowned.is_dir() and (tmp_path / "other-folder").is_dir()
        assert remove_stale_spools(tmp_path) == []
    finally:
        live.kill()
        live.wait()
    assert remove_stale_spools(tmp_path) == [kept]

"""The served model's chat-format pieces, read off its own chat template.

Callers build `prompt_prefix + user_prefix + message + user_suffix + assistant_prefix`
without knowing the template. The pieces are found by rendering the template around a
sentinel message, so they are exactly what `apply_chat_template` would produce.
"""

from __future__ import annotations

from typing import Any

from protos import inference_pb2

SENTINEL = "\u2063STREAMRAG_MESSAGE\u2063"


def chat_format(tokenizer: Any, eos_token_ids: tuple[int, ...]) -> inference_pb2.ChatFormat:
    messages = [{"role": "user", "content": SENTINEL}]
    with_answer = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    without = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=False)
    if SENTINEL not in without or not with_answer.startswith(without):
        raise ValueError("the chat template does not render a user message as expected")
    before, after = without.split(SENTINEL)
    return inference_pb2.ChatFormat(
        prompt_prefix=before, user_prefix="", user_suffix=after, assistant_prefix=with_answer[len(without):],
        eos_text=tokenizer.eos_token or "", eos_token_ids=list(eos_token_ids))

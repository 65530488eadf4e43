"""How a chat (a list of {role, content} messages) becomes a prompt: ONE rendering, shared by the
served OpenAI chat endpoint (trtbuild.serve.openai_api), `trtbuild bench` and the draft stage's
evaluation, so what is measured is what is served.

The tokenizer's chat template with the assistant turn opened (add_generation_prompt), then
encoded as the deployment encodes prompts (add_special_tokens, default on). A template that
writes BOS itself would get a second one from the encoder, so its leading BOS is dropped first.
Tokenizers without a template (the tiny rehearsal model) get a plain "role: content" transcript.
"""

from __future__ import annotations

from typing import Any

# For tokenizers without a chat template (the tiny rehearsal model was trained on plain text):
# one "role: content" line per message and an open assistant turn.
FALLBACK_CHAT_TEMPLATE = (
    "{% for message in messages %}{{ message['role'] }}: {{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)


def chat_template(tokenizer: Any) -> str:
    return getattr(tokenizer, "chat_template", None) or FALLBACK_CHAT_TEMPLATE


def render_chat(tokenizer: Any, messages: list[dict[str, str]], add_special_tokens: bool = True) -> str:
    """The prompt text of `messages`, ending with an open assistant turn."""
    text = tokenizer.apply_chat_template(messages, chat_template=chat_template(tokenizer), tokenize=False,
                                         add_generation_prompt=True)
    bos = getattr(tokenizer, "bos_token", None)
    # the encoder adds BOS itself (when the tokenizer has one to add): avoid a second one
    if (add_special_tokens and bos and text.startswith(bos)
            and tokenizer("", add_special_tokens=True)["input_ids"][:1] == [tokenizer.bos_token_id]):
        text = text[len(bos):]
    return text


def chat_prompt_ids(tokenizer: Any, messages: list[dict[str, str]], add_special_tokens: bool = True) -> list[int]:
    """Token ids of the prompt, as the served endpoint hands them to the model."""
    text = render_chat(tokenizer, messages, add_special_tokens)
    return list(tokenizer(text, add_special_tokens=add_special_tokens)["input_ids"])


def request_messages(chat: list[dict[str, str]]) -> list[dict[str, str]]:
    """A chat as a request: the turns before its final assistant answer (a recorded reply is what
    the model is to generate, not part of the prompt)."""
    end = len(chat)
    while end > 1 and chat[end - 1]["role"] == "assistant":
        end -= 1
    return chat[:end]


def record_prompt_ids(tokenizer: Any, records: list[Any], count: int, length: int,
                      add_special_tokens: bool = True) -> list[list[int]]:
    """`count` token-id prompts, evenly spaced over the records. A chat record becomes the request
    the served endpoint would see (`chat_prompt_ids`, any length: chat prompts are short); a text
    record gives its first `length` tokens, BOS included, and texts shorter than that are skipped."""
    usable: list[list[int]] = []
    for record in records:
        if isinstance(record, list):
            usable.append(chat_prompt_ids(tokenizer, request_messages(record), add_special_tokens))
        else:
            ids = tokenizer(record, add_special_tokens=True)["input_ids"]
            if len(ids) >= length:
                usable.append(list(ids[:length]))
    step = max(len(usable) // count, 1) if count else 1
    return [usable[i * step] for i in range(min(count, len(usable)))]

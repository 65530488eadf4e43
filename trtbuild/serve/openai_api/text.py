"""Prompt and output text rules of the OpenAI front: the chat template, usage counts, stop sequences."""

from __future__ import annotations

from typing import Any

from trtbuild.core.data.chat import FALLBACK_CHAT_TEMPLATE, chat_template, render_chat

__all__ = ["FALLBACK_CHAT_TEMPLATE", "PromptText", "StopText"]


class PromptText:
    """The tokenizer's view of prompts, with the deployment's add_special_tokens setting."""

    def __init__(self, tokenizer: Any, add_special_tokens: bool) -> None:
        self.tokenizer = tokenizer
        self.add_special_tokens = add_special_tokens
        self.template = chat_template(tokenizer)
        self.own_template = self.template is not FALLBACK_CHAT_TEMPLATE

    def chat(self, messages: list[dict[str, str]]) -> str:
        # the one rendering `trtbuild bench` and the draft stage's evaluation use as well
        return render_chat(self.tokenizer, messages, self.add_special_tokens)

    def count(self, text: str) -> int:
        return len(self.tokenizer(text, add_special_tokens=self.add_special_tokens)["input_ids"])


class StopText:
    """Applies stop sequences to streamed text: releases what cannot be the start of one, holds back
    the rest, and cuts the text before the first stop sequence it completes."""

    def __init__(self, stops: list[str]) -> None:
        self.stops = stops
        self.held = ""
        self.stopped = False

    def feed(self, delta: str) -> str:
        text = self.held + delta
        hits = [i for i in (text.find(s) for s in self.stops) if i >= 0]
        if hits:
            self.held, self.stopped = "", True
            return text[: min(hits)]
        keep = max((n for s in self.stops for n in range(min(len(s) - 1, len(text)), 0, -1)
                    if text.endswith(s[:n])), default=0)
        self.held = text[len(text) - keep:]
        return text[: len(text) - keep]

    def flush(self) -> str:
        out, self.held = self.held, ""
        return out

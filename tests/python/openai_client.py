"""Talks to a live `ocrctl serve` with the official `openai` Python client.

Usage: openai_client.py BASE_URL MODEL IMAGE MAX_TOKENS [API_KEY]
Prints one JSON object: the non-streaming text, usage, finish reason and per-token
logprobs, and the streamed text with its chunk count and final usage.
"""

import base64
import json
import mimetypes
import sys

from openai import OpenAI


def main() -> None:
    base_url, model, image, max_tokens = sys.argv[1:5]
    api_key = sys.argv[5] if len(sys.argv) > 5 else "unused"
    client = OpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=300)
    mime = mimetypes.guess_type(image)[0] or "image/png"
    with open(image, "rb") as f:
        url = f"data:{mime};base64,{base64.b64encode(f.read()).decode()}"
    messages = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}]}]
    models = [m.id for m in client.models.list().data]

    r = client.chat.completions.create(
        model=model,
        messages=messages,
        max_tokens=int(max_tokens),
        temperature=0,
        logprobs=True,
        top_logprobs=2,
    )
    choice = r.choices[0]
    logprobs = [
        {"token": t.token, "logprob": t.logprob, "top": [[a.token, a.logprob] for a in t.top_logprobs]}
        for t in choice.logprobs.content
    ]

    stream = client.chat.completions.create(
        model=model,
        messages=messages,
        max_tokens=int(max_tokens),
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    streamed, chunks, stream_usage, stream_finish, role = "", 0, None, None, None
    for chunk in stream:
        chunks += 1
        if chunk.usage is not None:
            stream_usage = chunk.usage.model_dump()
        for c in chunk.choices:
            if c.delta.role:
                role = c.delta.role
            if c.delta.content:
                streamed += c.delta.content
            if c.finish_reason:
                stream_finish = c.finish_reason

    print(json.dumps({
        "models": models,
        "text": choice.message.content,
        "finish_reason": choice.finish_reason,
        "usage": r.usage.model_dump(),
        "logprobs": logprobs,
        "stream_text": streamed,
        "stream_chunks": chunks,
        "stream_role": role,
        "stream_finish_reason": stream_finish,
        "stream_usage": stream_usage,
    }))


if __name__ == "__main__":
    main()

"""One OpenAI client for both deployments: `trtbuild serve` on CPU and trtllm-serve on a GPU host.

    OPENAI_BASE_URL=http://127.0.0.1:8003/v1 python scripts/openai_client.py   # trtbuild serve (CPU)
    OPENAI_BASE_URL=http://localhost:8000/v1 python scripts/openai_client.py   # bundle's launch/serve.sh
"""

import os

from openai import OpenAI

client = OpenAI(base_url=os.environ["OPENAI_BASE_URL"], api_key=os.environ.get("OPENAI_API_KEY", "unused"))
model = client.models.list().data[0].id  # the served model: "llm" (deploy.model_name) / "target" (trtllm-serve)
stream = client.chat.completions.create(
    model=model,
    messages=[{"role": "user", "content": "What does the for statement do?"}],
    max_tokens=32,
    temperature=0,
    stream=True,
)
for chunk in stream:
    if chunk.choices:
        print(chunk.choices[0].delta.content or "", end="", flush=True)
print()

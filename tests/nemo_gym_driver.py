"""Runs under the Python 3.13 venv that holds nemo-gym 0.7.0 (see the Makefile's ``nemo-gym-venv``), never under
the project's own interpreter: drives colo-fsm's server at ``argv[1]`` through nemo-gym's own client classes
(``NEMO_GYM_DRIVER_URL``; prompts as JSON in ``NEMO_GYM_DRIVER_PROMPTS``: nemo-gym reads ``sys.argv`` as hydra
overrides, so nothing goes there) and prints one JSON object of what they received (the 3.12 test compares it with what the engine generated).

* ``NeMoGymAsyncOpenAI``: models, completions (logprobs), chat (logprobs), tokenize, responses.
* ``VLLMModel`` (nemo-gym's responses server) with ``return_token_id_information=True``, over the chat path and
  with ``use_completions_api=True``; and its default (chat, no token ids): ``POST /v1/responses`` on its FastAPI app, which calls colo-fsm's server.
"""

from __future__ import annotations

import asyncio
import json
import os
from typing import Any
from unittest.mock import MagicMock


async def raw_client(base_url: str, prompts: list[str]) -> dict[str, Any]:
    from nemo_gym.openai_utils import NeMoGymAsyncOpenAI

    # the default client (internal=False) gives up after 3 tries on a 503: parked requests never need a retry
    c = NeMoGymAsyncOpenAI(base_url=base_url, api_key="unused")
    out: dict[str, Any] = {"models": await c.create_models()}
    out["completions"] = [
        await c.create_completion(
            model="m", prompt=p, max_tokens=6, temperature=1.0, logprobs=0, return_tokens_as_token_ids=True
        )
        for p in prompts
    ]
    out["chat"] = [
        await c.create_chat_completion(
            model="m",
            messages=[{"role": "user", "content": p}],
            max_tokens=6,
            temperature=1.0,
            logprobs=True,
            top_logprobs=0,
        )
        for p in prompts
    ]
    out["tokenize"] = await c.create_tokenize(model="m", prompt=prompts[0])
    out["response"] = await c.create_response(model="m", input=prompts[0], max_output_tokens=6, temperature=1.0)
    return out


def vllm_model(
    base_url: str, prompts: list[str], use_completions_api: bool, token_ids: bool = True
) -> list[dict[str, Any]]:
    import nemo_gym.server_utils
    from fastapi.testclient import TestClient
    from nemo_gym.server_utils import ServerClient
    from responses_api_models.vllm_model.app import VLLMModel, VLLMModelConfig

    nemo_gym.server_utils.get_global_config_dict = MagicMock(return_value={})  # no gym config file in a test
    config = VLLMModelConfig(
        host="127.0.0.1",
        port=0,
        base_url=base_url,
        api_key="unused",  # pragma: allowlist secret
        model="colo-fsm",
        entrypoint="",
        name="colo_fsm_policy",
        return_token_id_information=token_ids,
        uses_reasoning_parser=False,
        use_completions_api=use_completions_api,
    )
    server = VLLMModel(config=config, server_client=MagicMock(spec=ServerClient, global_config_dict={}))
    app = server.setup_webserver()
    outs = []
    with TestClient(app) as client:
        for p in prompts:
            r = client.post(
                "/v1/responses",
                json={"input": [{"role": "user", "content": p}], "max_output_tokens": 6, "temperature": 1.0},
            )
            if r.status_code != 200:
                raise SystemExit(f"VLLMModel /v1/responses -> {r.status_code}: {r.text[:500]}")
            outs.append(r.json())
    return outs


def main() -> None:
    base_url, prompts = os.environ["NEMO_GYM_DRIVER_URL"], json.loads(os.environ["NEMO_GYM_DRIVER_PROMPTS"])
    import nemo_gym.server_utils

    out = asyncio.run(raw_client(base_url, prompts))
    nemo_gym.server_utils._GLOBAL_AIOHTTP_CLIENT = None  # bound to that closed loop; the next one makes its own
    out["vllm_chat"] = vllm_model(base_url, prompts, use_completions_api=False)
    nemo_gym.server_utils._GLOBAL_AIOHTTP_CLIENT = None
    out["vllm_completions"] = vllm_model(base_url, prompts, use_completions_api=True)
    nemo_gym.server_utils._GLOBAL_AIOHTTP_CLIENT = None
    out["vllm_default"] = vllm_model(base_url, prompts, use_completions_api=False, token_ids=False)
    print("NEMO_GYM_RESULT " + json.dumps(out))


if __name__ == "__main__":
    main()

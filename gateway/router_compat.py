"""HTTP routes that cache-aware routers call on a model server, beside the OpenAI API.

Design: `routes(gw)` returns Starlette routes over the app's `Gateway` (built by `Gateway.route`,
so the key check and error mapping are the generation routes' own); `create_app` appends them
to its own. Nothing here generates text: these answer the metadata and tokenization calls
of the routers slotserve sits behind (docs/operations.md, "Scale-out").

    route                              key   caller and what it reads
    GET  /model_info, /get_model_info  no    SGLang Model Gateway at registration: served_model_name
                                             (the worker's model id), is_generation
    GET  /server_info, /get_server_info no   SGLang Model Gateway at registration: dp_size (with
                                             --dp-aware), served_model_name
    POST /v1/completions/render        yes   Inference Extension / llm-d precise prefix scoring:
    POST /v1/chat/completions/render   yes   the exact prompt token ids slotserve would prefill

The SGLang router probes `GET /health` (the gateway's own route) before these, then forwards
/v1/chat/completions and /v1/completions unchanged apart from a few extra SGLang fields, which
the gateway's request structs ignore or accept (`logprobs: false`, `ignore_eos: false`).

NOTE: /model_info gives no `model_path` or `tokenizer_path`. For any path it is given, the SGLang
router tries to fetch a tokenizer from the Hugging Face hub (a GGUF path is not one), which only
costs a failed network call and a warning; its HTTP cache-aware policy routes on request text and
needs no tokenizer.

The render routes build the request exactly as the generation routes do (`translate.chat_plan`
/ `translate.completion_request`), so the ids are the ones the scheduler would receive, and a
request the generation route would reject is rejected here with the same 4xx.
"""

from __future__ import annotations

import msgspec
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from .. import __version__
from . import protocol as p
from . import translate
from .errors import json_response
from .state import Gateway


class RenderResponse(msgspec.Struct, kw_only=True):
    """What /v1/*/render returns: the prompt as slotserve would prefill it."""

    object: str  # "render"
    model: str
    prompt_token_ids: list[int]  # exactly the ids handed to the scheduler
    num_prompt_tokens: int
    prompt: str  # the chat template's rendering (chat), or the prompt text / its decoding
    max_model_len: int  # tokens per slot; longer prompts are refused by the generation route


async def model_info(gw: Gateway, request: Request) -> Response:
    rt = gw.runtime
    return json_response(
        {
            "served_model_name": rt.model_name,
            "is_generation": True,
            "max_context_length": rt.ctx_len,
            "max_req_input_len": rt.ctx_len - 1,  # at least one generated token must fit
            "vocab_size": rt.n_vocab,
            "eos_token_ids": list(rt.tokenizer.eos_token_ids),
            "supports_vision": False,
            "weight_version": "default",
        }
    )


async def server_info(gw: Gateway, request: Request) -> Response:
    rt = gw.runtime
    stats = rt.scheduler.stats()
    return json_response(
        {
            "server": "slotserve",
            "version": __version__,
            "served_model_name": rt.model_name,
            "dp_size": 1,
            "tp_size": 1,
            "context_length": rt.ctx_len,
            "max_running_requests": rt.num_slots,  # one request per slot
            "max_total_num_tokens": rt.num_slots * rt.ctx_len,
            "batched_session": rt.num_slots,
            "kernel_variant": rt.kernel_variant,
            "internal_states": [
                {
                    "num_running_requests": stats.num_running,
                    "num_waiting_requests": stats.queue_depth,
                    "live_tokens": sum(s.num_tokens for s in stats.slots),
                    "draining": stats.draining,
                }
            ],
        }
    )


def _render(gw: Gateway, model: str, ids: list[int], text: str) -> Response:
    return json_response(
        RenderResponse(
            object="render",
            model=model,
            prompt_token_ids=ids,
            num_prompt_tokens=len(ids),
            prompt=text,
            max_model_len=gw.runtime.ctx_len,
        )
    )


async def chat_render(gw: Gateway, request: Request) -> Response:
    req = await gw.read_body(request, p.ChatCompletionRequest)
    model = gw.check_model(req.model)
    chat = translate.chat_input(req)
    gen = translate.chat_plan(chat, gw.config, gw.runtime, "render").gen
    text = ""
    if gw.runtime.chat is not None:  # chat_plan already rendered once; render again for the text (cheap)
        text = gw.runtime.render_chat(chat.messages, chat.template_tools())
    return _render(gw, model, list(gen.prompt_ids), text)


async def completion_render(gw: Gateway, request: Request) -> Response:
    req = await gw.read_body(request, p.CompletionRequest)
    model = gw.check_model(req.model)
    gen = translate.completion_request(req, gw.config, gw.runtime, "render")
    prompt = req.prompt[0] if isinstance(req.prompt, list) and len(req.prompt) == 1 else req.prompt
    text = prompt if isinstance(prompt, str) else gw.runtime.decode(gen.prompt_ids)
    return _render(gw, model, list(gen.prompt_ids), text)


def routes(gw: Gateway) -> list[Route]:
    """The router-facing routes over `gw` (the app's `Gateway`, `app.state.gateway`)."""

    route = gw.route
    return [
        # metadata probes: unauthenticated like /health (the router sends no key at registration)
        route("/model_info", model_info, ["GET"], protected=False),
        route("/get_model_info", model_info, ["GET"], protected=False),  # older SGLang routers
        route("/server_info", server_info, ["GET"], protected=False),
        route("/get_server_info", server_info, ["GET"], protected=False),
        route("/v1/chat/completions/render", chat_render, ["POST"], protected=True),
        route("/v1/completions/render", completion_render, ["POST"], protected=True),
    ]

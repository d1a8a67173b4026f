"""`tpu_export.serve` with an LM: a tiny seeded Llama directory converted with ``convert_lm`` for tpu-v6e (no AOT
compile; PJRT CPU runs it), served on loopback, asked through the ``openai`` Python client and httpx. Greedy text
equals transformers' own generate (completions and the chat template); streamed pieces add up to the whole text;
stop sequences, seeds and the request checks behave as OpenAI's API documents."""

from __future__ import annotations

import httpx
import pytest

pytest.importorskip("transformers")
openai = pytest.importorskip("openai")
pytest.importorskip("uvicorn")

import tpu_export  # noqa: E402
from tests.llm_models import greedy_reference, save_model_dir  # noqa: E402
from tests.test_serve import metric, serving  # noqa: E402
from tpu_export import serve  # noqa: E402

pytestmark = [pytest.mark.slow]

NEW = 32
PROMPT = "the cache holds keys"  # 4 tokens of the test tokenizer
CHAT = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "the cache holds"}]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_model_dir("llama", tmp_path_factory.mktemp("hf") / "llama")


@pytest.fixture(scope="module")
def reference(model_dir):
    return greedy_reference(model_dir, PROMPT, NEW)


@pytest.fixture(scope="module")
def chat_reference(model_dir):
    """transformers' greedy reply to CHAT under the directory's chat template (up to its eos)."""
    import torch
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(model_dir)
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir).eval()
    text = tok.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=False)
    ids = tok(text, return_tensors="pt").input_ids
    with torch.no_grad():
        new = model.generate(ids, do_sample=False, max_new_tokens=NEW)[0, ids.shape[1]:].tolist()
    eos = model.generation_config.eos_token_id
    stopped = eos in new
    new = new[:new.index(eos)] if stopped else new
    return {"text": tok.decode(new, skip_special_tokens=False), "prompt_tokens": ids.shape[1],
            "finish": "stop" if stopped else "length"}


@pytest.fixture(scope="module")
def lm_folder(model_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("lm") / "out"
    tpu_export.convert_lm(model_dir, {"tpu-v6e": {"aot": False}}, out, prefill_lengths=(8, 16), cache_len=64)
    return out / "tpu-v6e"


@pytest.fixture(scope="module")
def base(lm_folder):
    with serving(serve.app([f"tiny={lm_folder}"])) as url:
        yield url


@pytest.fixture(scope="module")
def client(base):
    return openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=120)


def test_models_lists_the_lm(client, base):
    assert [m.id for m in client.models.list()] == ["tiny"]
    meta = httpx.get(f"{base}/v2/models/tiny").json()
    assert meta["inputs"] == [{"name": "text_input", "datatype": "BYTES", "shape": [1]}]


def test_greedy_completion_matches_transformers(client, reference):
    r = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=NEW, temperature=0)
    assert r.choices[0].text == reference["text"]
    assert r.choices[0].finish_reason == "length"
    assert (r.usage.prompt_tokens, r.usage.completion_tokens, r.usage.total_tokens) == (4, NEW, 4 + NEW)
    assert r.object == "text_completion" and r.model == "tiny"


def test_chat_completion_uses_the_chat_template(client, chat_reference):
    r = client.chat.completions.create(model="tiny", messages=CHAT, max_tokens=NEW, temperature=0)
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].message.content == chat_reference["text"]
    assert r.choices[0].finish_reason == chat_reference["finish"]
    assert r.usage.prompt_tokens == chat_reference["prompt_tokens"]


def test_streaming_adds_up_to_the_whole_text(client, reference, chat_reference):
    chunks = list(client.completions.create(model="tiny", prompt=PROMPT, max_tokens=NEW, temperature=0,
                                            stream=True, stream_options={"include_usage": True}))
    pieces = [c.choices[0].text for c in chunks if c.choices]
    assert len([p for p in pieces if p]) > 5  # streamed as it was generated, not in one piece
    assert "".join(pieces) == reference["text"]
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].usage.completion_tokens == NEW and chunks[-1].usage.prompt_tokens == 4
    chat = list(client.chat.completions.create(model="tiny", messages=CHAT, max_tokens=NEW, temperature=0,
                                               stream=True))
    assert chat[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chat) == chat_reference["text"]


def test_stop_sequences_cut_the_text(client, reference):
    text = reference["text"]
    stop = text[9:12]
    want = text[:text.index(stop)]
    r = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=NEW, temperature=0, stop=[stop, "\u2603"])
    assert r.choices[0].text == want and r.choices[0].finish_reason == "stop"
    streamed = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=NEW, temperature=0, stop=stop,
                                         stream=True)
    assert "".join(c.choices[0].text for c in streamed) == want


def test_sampling_with_a_seed_repeats(client, reference):
    def sample(seed, **extra):
        return client.completions.create(model="tiny", prompt=PROMPT, max_tokens=NEW, temperature=1.5, top_p=0.95,
                                         seed=seed, extra_body=extra).choices[0].text

    a = sample(7, top_k=50)
    assert a == sample(7, top_k=50) and a != reference["text"]
    assert sample(8, top_k=50) != a
    # top_k 1 is greedy whatever the temperature
    assert sample(3, top_k=1) == reference["text"]


def test_v2_infer_generates_text(base, reference):
    body = {"inputs": [{"name": "text_input", "datatype": "BYTES", "shape": [1], "data": [PROMPT]}],
            "parameters": {"max_tokens": NEW}}
    r = httpx.post(f"{base}/v2/models/tiny/infer", json=body, timeout=120)
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["outputs"][0]["data"] == [reference["text"]] and out["parameters"]["completion_tokens"] == NEW


def test_bad_requests_are_400_naming_the_param(base):
    url = f"{base}/v1/completions"

    def bad(body, param, *words, status=400):
        r = httpx.post(url, json={"model": "tiny", "prompt": PROMPT, **body}, timeout=60)
        assert r.status_code == status, r.text
        err = r.json()["error"]
        assert err["param"] == param, err
        for w in words:
            assert w in err["message"], err
        return err

    bad({"prompt": "the cache holds keys " * 30}, "prompt", "prefill")
    bad({"max_tokens": 100}, "max_tokens", "the model holds 64")
    bad({"max_tokens": 0}, "max_tokens", ">= 1")
    bad({"temperature": -1}, "temperature", ">= 0")
    bad({"top_p": 1.5}, "top_p", "(0, 1]")
    bad({"top_k": 0}, "top_k", ">= 1")
    bad({"n": 2}, "n", "not implemented")
    bad({"logprobs": 3}, "logprobs", "not implemented")
    bad({"frobnicate": 1}, "frobnicate", "not a field")
    bad({"stop": [""]}, "stop", "non-empty")
    bad({"prompt": ["a", "b"]}, "prompt", "a string")
    bad({"model": "nope"}, "model", "served: ['tiny']", status=404)
    r = httpx.post(f"{base}/v1/chat/completions", json={"model": "tiny", "messages": [
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "file:///etc/passwd"}}]}]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages[0].content[0]", r.text
    with pytest.raises(openai.BadRequestError) as e:
        openai.OpenAI(base_url=f"{base}/v1", api_key="x", max_retries=0).completions.create(
            model="tiny", prompt=PROMPT, max_tokens=NEW, presence_penalty=1.0)
    assert "presence_penalty" in str(e.value)


def test_message_content_is_data_not_template_code(base, lm_folder):
    """A message's content is a value the template prints, never template code run on the server."""
    r = httpx.post(f"{base}/v1/chat/completions", timeout=60, json={
        "model": "tiny", "max_tokens": 1, "temperature": 0,
        "messages": [{"role": "user", "content": "{{ 7*7 }}{% for i in range(99999999) %}x{% endfor %}"}]})
    assert r.status_code == 200, r.text
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(lm_folder / "tokenizer.json"))
    literal = "user: {{ 7*7 }}{% for i in range(99999999) %}x{% endfor %}\nassistant:"  # the test's template
    assert r.json()["usage"]["prompt_tokens"] == len(tok.encode(literal).ids)


def test_metrics_count_tokens(base, client):
    before = metric(base, "tpu_export_serve_generated_tokens_total", model="tiny")
    client.completions.create(model="tiny", prompt=PROMPT, max_tokens=5, temperature=0)
    assert metric(base, "tpu_export_serve_generated_tokens_total", model="tiny") == before + 5
    assert metric(base, "tpu_export_serve_decode_tokens_per_second", model="tiny") > 0
    assert metric(base, "tpu_export_serve_requests_total", model="tiny", endpoint="completions", code="200") >= 1


def test_a_cancelled_generation_stops_at_its_next_token(lm_folder):
    """What a client hanging up does to a running generation (the stream's close sets the job's cancel flag): the
    loop stops at the next token instead of running to max_tokens."""
    import time

    from tpu_export.generate import Sampling
    from tpu_export.serve._batcher import Job
    from tpu_export.serve._models import Aborted

    model = serve.app([f"tiny={lm_folder}"]).state.server.models["tiny"]
    req = model.prepare(PROMPT, NEW, Sampling(), [])
    job = Job("tiny", 1, req, time.monotonic() + 60)
    pieces = []

    def hang_up(text):
        pieces.append(text)
        job.cancel.set()

    req.emit = hang_up
    (res,) = model.run([job])
    assert isinstance(res, Aborted) and res.reason == "disconnect" and len(pieces) == 1
    req.emit, job = None, Job("tiny", 1, req, time.monotonic() - 1)  # a deadline already past
    (res,) = model.run([job])
    assert isinstance(res, Aborted) and res.reason == "deadline"

"""The server through the official openai client: chat and completions, streaming and not, stop strings,
seeds, logprobs, n, usage and finish reasons."""
import math

import pytest

from srv_util import post_json, request

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


def test_models_lists_the_served_model(client, model_id):
    models = client.models.list()
    assert [m.id for m in models.data] == [model_id]
    assert client.models.retrieve(model_id).id == model_id


def test_chat_completion(client, model_id):
    r = client.chat.completions.create(model=model_id, messages=QUESTION, max_tokens=40, temperature=0)
    assert r.object == "chat.completion" and r.model == model_id and r.id.startswith("chatcmpl-")
    c = r.choices[0]
    assert c.index == 0 and c.message.role == "assistant"
    assert "Paris" in c.message.content
    assert c.finish_reason == "stop"  # the model ended its turn before 40 tokens
    assert "<|im_end|>" not in c.message.content
    assert r.usage.prompt_tokens > 10
    assert 0 < r.usage.completion_tokens < 40
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_chat_stream_equals_non_stream(client, model_id):
    full = client.chat.completions.create(model=model_id, messages=QUESTION, max_tokens=40, temperature=0)
    chunks = list(client.chat.completions.create(model=model_id, messages=QUESTION, max_tokens=40, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == full.choices[0].message.content
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["stop"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == full.usage.completion_tokens
    assert chunks[-1].usage.prompt_tokens == full.usage.prompt_tokens
    assert all(c.id == chunks[0].id and c.object == "chat.completion.chunk" for c in chunks)


def test_completion_and_length_finish(client, model_id):
    r = client.completions.create(model=model_id, prompt="The capital of France is", max_tokens=12, temperature=0)
    assert r.object == "text_completion"
    assert "Paris" in r.choices[0].text
    assert r.choices[0].finish_reason == "length"
    assert r.usage.prompt_tokens == 5 and r.usage.completion_tokens == 12 and r.usage.total_tokens == 17


def test_completion_default_max_tokens_is_16(client, model_id):
    r = client.completions.create(model=model_id, prompt="Once upon a time", temperature=0,
                                  extra_body={"ignore_eos": True})
    assert r.usage.completion_tokens == 16 and r.choices[0].finish_reason == "length"


def test_completion_stream_equals_non_stream(client, model_id):
    full = client.completions.create(model=model_id, prompt="The capital of France is", max_tokens=12, temperature=0)
    chunks = list(client.completions.create(model=model_id, prompt="The capital of France is", max_tokens=12,
                                            temperature=0, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == full.choices[0].text
    assert chunks[-1].choices[0].finish_reason == "length"
    assert all(c.choices[0].finish_reason is None for c in chunks[:-1])


def test_prompt_as_token_ids(client, model_id, base):
    status, tok = post_json(base, "/tokenize", {"prompt": "The capital of France is"})
    assert status == 200 and tok["count"] == len(tok["tokens"]) == 5
    a = client.completions.create(model=model_id, prompt=tok["tokens"], max_tokens=8, temperature=0)
    b = client.completions.create(model=model_id, prompt="The capital of France is", max_tokens=8, temperature=0)
    assert a.choices[0].text == b.choices[0].text


def test_usage_reports_cached_prompt_tokens(client, model_id):
    # a 40-token prompt no other test sends: the first request computes it all; the same prompt again finds its two
    # full 16-token blocks in the prefix cache (usage.prompt_tokens_details.cached_tokens, as OpenAI and vLLM report)
    prompt = [(i * 37 + 1001) % 40000 + 500 for i in range(40)]
    a = client.completions.create(model=model_id, prompt=prompt, max_tokens=2, temperature=0)
    assert a.usage.prompt_tokens == 40 and a.usage.prompt_tokens_details.cached_tokens == 0
    b = client.completions.create(model=model_id, prompt=prompt, max_tokens=2, temperature=0)
    assert b.usage.prompt_tokens_details.cached_tokens == 32
    chunks = list(client.completions.create(model=model_id, prompt=prompt, max_tokens=2, temperature=0, stream=True,
                                            stream_options={"include_usage": True}))
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens == 32
    assert b.choices[0].text == a.choices[0].text == "".join(c.choices[0].text for c in chunks if c.choices)


@pytest.mark.parametrize("stream", [False, True])
def test_stop_strings(client, model_id, stream):
    full = client.completions.create(model=model_id, prompt="The capital of France is", max_tokens=12, temperature=0)
    text = full.choices[0].text
    assert "." in text
    kw = dict(model=model_id, prompt="The capital of France is", max_tokens=12, temperature=0, stop=["zzz", "."])
    if stream:
        chunks = list(client.completions.create(stream=True, **kw))
        got, finish = "".join(c.choices[0].text for c in chunks), chunks[-1].choices[0].finish_reason
    else:
        r = client.completions.create(**kw)
        got, finish = r.choices[0].text, r.choices[0].finish_reason
    assert got == text[: text.index(".")]
    assert finish == "stop"
    # a single string works too
    r = client.completions.create(model=model_id, prompt="The capital of France is", max_tokens=12, temperature=0,
                                  stop=".")
    assert r.choices[0].text == text[: text.index(".")]


def test_seed_reproducible_at_temperature(client, model_id):
    kw = dict(model=model_id, prompt="Once upon a time", max_tokens=24, temperature=1.0,
              extra_body={"ignore_eos": True})
    a = client.completions.create(seed=7, **kw).choices[0].text
    b = client.completions.create(seed=7, **kw).choices[0].text
    c = client.completions.create(seed=8, **kw).choices[0].text
    assert a == b
    assert a != c
    # chat, streamed, same seed -> same text as non-streamed
    ck = dict(model=model_id, messages=[{"role": "user", "content": "Tell me a story."}], max_tokens=24,
              temperature=0.9, seed=11)
    x = client.chat.completions.create(**ck).choices[0].message.content
    y = "".join(ch.choices[0].delta.content or "" for ch in client.chat.completions.create(stream=True, **ck)
                if ch.choices)
    assert x == y


def test_sampling_fields_are_accepted(client, model_id):
    r = client.completions.create(model=model_id, prompt="Hello", max_tokens=8, temperature=0.7, top_p=0.9,
                                  presence_penalty=0.5, frequency_penalty=0.5, seed=3,
                                  extra_body={"top_k": 20, "min_p": 0.05, "priority": -1})
    assert r.choices[0].finish_reason in ("stop", "length")
    # top_k = 1 is greedy at any temperature
    g = client.completions.create(model=model_id, prompt="Hello", max_tokens=8, temperature=0).choices[0].text
    k1 = client.completions.create(model=model_id, prompt="Hello", max_tokens=8, temperature=1.5,
                                   extra_body={"top_k": 1}).choices[0].text
    assert g == k1
    # the extensions repetition_penalty and repeat_last_n (llama.cpp's window over the generated ids): a window of 0
    # turns the penalty off, a window of 4 changes the greedy text (repeat_last_n out of range: a 400)
    kw = dict(model=model_id, prompt="one two one two one two", max_tokens=24, temperature=0)
    off = client.completions.create(extra_body={"repetition_penalty": 3.0, "repeat_last_n": 0}, **kw).choices[0].text
    on = client.completions.create(extra_body={"repetition_penalty": 3.0, "repeat_last_n": 4}, **kw).choices[0].text
    plain = client.completions.create(**kw).choices[0].text
    assert off == plain and on != plain
    with pytest.raises(Exception) as ex:
        client.completions.create(extra_body={"repeat_last_n": -2}, **kw)
    assert "repeat_last_n" in str(ex.value)


def test_completion_logprobs(client, model_id):
    r = client.completions.create(model=model_id, prompt="The capital of France is", max_tokens=6, temperature=0,
                                  logprobs=3)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == 6
    assert "".join(lp.tokens) == r.choices[0].text
    for tok, l, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        assert l <= 0
        assert 3 <= len(top) <= 4  # the 3 most likely, plus the sampled one when it is not among them
        assert tok in top and math.isclose(top[tok], l, rel_tol=1e-6)
        assert max(top.values()) == pytest.approx(l)  # greedy: the sampled token is the most likely
    assert lp.text_offset == sorted(lp.text_offset) and lp.text_offset[0] == 0
    # logprobs=0: the sampled token only
    r0 = client.completions.create(model=model_id, prompt="The capital of France is", max_tokens=3, temperature=0,
                                   logprobs=0)
    assert all(len(t) == 1 for t in r0.choices[0].logprobs.top_logprobs)
    assert r0.choices[0].logprobs.token_logprobs == pytest.approx(lp.token_logprobs[:3])


@pytest.mark.parametrize("stream", [False, True])
def test_chat_logprobs(client, model_id, stream):
    kw = dict(model=model_id, messages=QUESTION, max_tokens=8, temperature=0, logprobs=True, top_logprobs=2)
    if stream:
        entries = []
        text = ""
        for ch in client.chat.completions.create(stream=True, **kw):
            if ch.choices and ch.choices[0].logprobs:
                entries += ch.choices[0].logprobs.content
            if ch.choices:
                text += ch.choices[0].delta.content or ""
    else:
        r = client.chat.completions.create(**kw)
        entries, text = r.choices[0].logprobs.content, r.choices[0].message.content
    assert len(entries) >= 1
    assert "".join(e.token for e in entries) == text
    for e in entries:
        assert e.logprob <= 0 and bytes(e.bytes).decode() == e.token
        assert len(e.top_logprobs) == 2
        assert e.top_logprobs[0].token == e.token and e.top_logprobs[0].logprob == pytest.approx(e.logprob)
        assert e.top_logprobs[1].logprob <= e.top_logprobs[0].logprob
    # logprobs without alternatives
    r = client.chat.completions.create(model=model_id, messages=QUESTION, max_tokens=4, temperature=0, logprobs=True)
    assert all(e.top_logprobs == [] for e in r.choices[0].logprobs.content)
    # none asked: none given
    r = client.chat.completions.create(model=model_id, messages=QUESTION, max_tokens=4, temperature=0)
    assert r.choices[0].logprobs is None


def test_n_choices(client, model_id):
    r = client.completions.create(model=model_id, prompt="Once upon a time", max_tokens=10, temperature=1.0, n=3,
                                  seed=5, extra_body={"ignore_eos": True})
    assert [c.index for c in r.choices] == [0, 1, 2]
    assert len({c.text for c in r.choices}) > 1  # different seeds per choice
    assert r.usage.completion_tokens == 30 and r.usage.prompt_tokens == 4
    chunks = list(client.chat.completions.create(model=model_id, messages=QUESTION, max_tokens=10, temperature=0,
                                                 n=2, stream=True))
    texts = {0: "", 1: ""}
    finishes = {}
    for ch in chunks:
        for c in ch.choices:
            texts[c.index] += c.delta.content or ""
            if c.finish_reason:
                finishes[c.index] = c.finish_reason
    assert texts[0] == texts[1] and "Paris" in texts[0]  # greedy: the same answer twice
    assert set(finishes) == {0, 1}


def test_tokenize_detokenize(base):
    status, t = post_json(base, "/tokenize", {"prompt": "Hello, world!"})
    assert status == 200 and t["tokens"] == [19556, 28, 905, 17] and t["count"] == 4 and t["max_model_len"] == 1024
    status, d = post_json(base, "/detokenize", {"tokens": t["tokens"]})
    assert status == 200 and d["prompt"] == "Hello, world!"
    status, t = post_json(base, "/tokenize", {"prompt": "Hi", "return_token_strs": True})
    assert t["token_strs"] == ["Hi"]
    status, c = post_json(base, "/tokenize", {"messages": QUESTION})
    assert status == 200 and c["count"] > 10
    status, d = post_json(base, "/detokenize", {"tokens": c["tokens"]})
    assert d["prompt"].endswith("<|im_start|>assistant\n")


def test_health_and_metrics_names(base, client, model_id):
    status, _, body = request(base, "GET", "/health")
    assert status == 200
    client.completions.create(model=model_id, prompt="Hi", max_tokens=2, temperature=0)
    status, hd, body = request(base, "GET", "/metrics")
    assert status == 200 and hd["content-type"].startswith("text/plain; version=0.0.4")
    text = body.decode()
    for h in ("time_to_first_token_seconds", "time_per_output_token_seconds", "inter_token_latency_seconds",
              "e2e_request_latency_seconds", "request_queue_time_seconds"):
        assert f"# TYPE tokenmill:{h} histogram" in text
        assert f'tokenmill:{h}_bucket{{le="+Inf"}}' in text
    for g in ("num_requests_running", "num_requests_waiting", "kv_cache_usage_perc"):
        assert f"# TYPE tokenmill:{g} gauge" in text
    for c in ("prefix_cache_hits_total", "prefix_cache_queries_total", "num_preemptions_total", "prompt_tokens_total",
              "generation_tokens_total"):
        assert f"# TYPE tokenmill:{c} counter" in text
    from srv_util import metrics
    m = metrics(base)
    assert m["tokenmill:generation_tokens_total"] >= 2 and m["tokenmill:prompt_tokens_total"] >= 1
    assert m['tokenmill:time_to_first_token_seconds_count'] >= 1

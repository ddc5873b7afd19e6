"""diffzoo.models.lm, the DiffLlama converter, text data, needles and the retrieval scores."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from diffzoo.data.needles import make_needle_sample, needle_text, query_text, recall_window
from diffzoo.data.text import (
    ByteTokenizer,
    RandomWindowSampler,
    TextDataModule,
    TokenWindows,
    load_tokens,
    pydoc_topics_text,
    tokenize_corpus,
)
from diffzoo.evaluation.retrieval import attention_scores, evaluate_retrieval
from diffzoo.layers import Attention, count_parameters
from diffzoo.models.lm import CausalLM, LMConfig, generate, left_pad, matched_lm_pair, sample_next

ATTNS = ("diff", "diff_v2", "softmax")


def tiny(attn: str = "diff", **kw) -> CausalLM:
    torch.manual_seed(0)
    return CausalLM.from_preset("lm_tiny", attn=attn, vocab_size=kw.pop("vocab_size", 61), **kw).eval()


# -- model ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("attn", ATTNS)
def test_forward_shape_and_every_parameter_gets_a_gradient(attn: str) -> None:
    model = tiny(attn, num_kv_heads=2).train()
    tokens = torch.randint(0, 61, (2, 9))
    logits = model(tokens)
    assert logits.shape == (2, 9, 61) and torch.isfinite(logits).all()
    torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens.flatten()).backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None or not p.grad.abs().sum() > 0]
    assert not missing, missing


def test_causality_later_tokens_do_not_change_earlier_logits() -> None:
    model = tiny()
    a = torch.randint(0, 61, (1, 10))
    b = a.clone()
    b[0, 6:] = (b[0, 6:] + 1) % 61
    assert torch.allclose(model(a)[:, :6], model(b)[:, :6], atol=1e-6)
    assert not torch.allclose(model(a)[:, 6:], model(b)[:, 6:], atol=1e-4)


def test_tied_and_untied_embeddings() -> None:
    tied, untied = tiny(tie_embeddings=True), tiny(tie_embeddings=False)
    assert tied.output.weight is tied.tok_embeddings.weight
    assert untied.output.weight is not untied.tok_embeddings.weight
    assert count_parameters(untied) - count_parameters(tied) == 61 * 64


@pytest.mark.parametrize("preset", ["lm_tiny", "lm_nano", "lm_micro"])
def test_matched_softmax_baseline(preset: str) -> None:
    from diffzoo.models.lm import LM_PRESETS

    cfg = LMConfig(**LM_PRESETS[preset])
    softmax, diff = matched_lm_pair(cfg)
    n_soft, n_diff = count_parameters(softmax), count_parameters(diff)
    assert n_diff - n_soft == cfg.depth * 6 * cfg.head_dim  # 4 lambda vectors + the per-head norm weight
    assert abs(n_diff - n_soft) / n_soft < 0.005
    assert type(softmax.blocks[0].attn).__name__ == "Attention" and type(diff.blocks[0].attn).__name__ == "DiffAttention"
    # lambda_init follows the 0-based depth schedule
    assert diff.blocks[0].attn.lambda_init == pytest.approx(0.2) and diff.blocks[-1].attn.lambda_init > 0.2


def test_config_errors() -> None:
    with pytest.raises(ValueError, match="unknown attention variant .linear."):
        LMConfig(attn="linear")
    with pytest.raises(ValueError, match="even"):
        LMConfig(dim=96, num_heads=3, attn="diff")
    with pytest.raises(ValueError, match="preset"):
        CausalLM.from_preset("lm_huge")


# -- generation ----------------------------------------------------------------------------------
@pytest.mark.parametrize("attn", ATTNS)
def test_cached_generation_matches_uncached_forward_with_left_padding(attn: str) -> None:
    model = tiny(attn, num_kv_heads=2)
    prompts = [[5, 6, 7, 8, 9, 10], [3, 4], [1, 2, 3]]
    new, step_logits = generate(model, prompts, 5, return_logits=True)
    assert new.shape == (3, 5) and step_logits.shape == (3, 5, 61)
    full = [p + new[i].tolist() for i, p in enumerate(prompts)]
    tokens, padding = left_pad(full)
    assert padding[1, :4].all() and not padding[1, 4:].any()
    uncached = model(tokens, key_padding_mask=padding)[:, -6:-1]  # logits that chose the 5 new tokens
    assert torch.allclose(step_logits, uncached, atol=1e-5)
    # a left-padded sequence gets the logits it gets alone (positions count real tokens only)
    alone = model(torch.tensor([full[1]]))[:, -6:-1]
    assert torch.allclose(step_logits[1:2], alone, atol=1e-5)
    assert torch.equal(new, step_logits.argmax(-1))  # greedy


def test_sampling_options() -> None:
    logits = torch.tensor([[0.0, 3.0, 1.0, 2.0, -1.0]]).repeat(400, 1)
    g = torch.Generator().manual_seed(0)
    assert torch.equal(sample_next(logits, 0.0), torch.full((400,), 1))
    assert torch.equal(sample_next(logits, 1.0, top_k=1, generator=g), torch.full((400,), 1))
    top2 = sample_next(logits, 1.0, top_k=2, generator=g)
    assert set(top2.tolist()) == {1, 3}
    nucleus = sample_next(logits, 1.0, top_p=0.8, generator=g)  # p(1)=.64, p(3)=.24: both needed for 0.8
    assert set(nucleus.tolist()) == {1, 3}
    assert set(sample_next(logits, 1.0, top_p=0.5, generator=g).tolist()) == {1}
    hot = sample_next(logits, 5.0, generator=torch.Generator().manual_seed(1))
    assert len(set(hot.tolist())) == 5  # high temperature reaches every token
    again = sample_next(logits, 5.0, generator=torch.Generator().manual_seed(1))
    assert torch.equal(hot, again)


def test_generate_stops_at_eos_and_keeps_emitting_it() -> None:
    model = tiny()
    greedy = generate(model, [[1, 2, 3]], 4)
    eos = int(greedy[0, 0])
    out = generate(model, [[1, 2, 3], [4, 5]], 4, eos_id=eos)
    assert out[0, 0] == eos and (out[0] == eos).all()
    with pytest.raises(ValueError, match="at least one token"):
        generate(model, [[1], []], 2)


# -- transformers' DiffLlama ---------------------------------------------------------------------
@pytest.mark.parametrize("tie,kv_heads,bias", [(False, 4, False), (True, 2, True)])
def test_difflama_conversion_both_ways(tie: bool, kv_heads: int, bias: bool) -> None:
    transformers = pytest.importorskip("transformers")
    from diffzoo.weights.hf_difflama import diffzoo_state_dict_to_hf, from_hf_difflama, to_hf_difflama

    torch.manual_seed(0)
    cfg = transformers.DiffLlamaConfig(
        vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=8,
        num_key_value_heads=kv_heads, tie_word_embeddings=tie, attention_bias=bias, rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 500.0},
    )
    hf = transformers.DiffLlamaForCausalLM(cfg).eval()
    with torch.no_grad():  # move norms and biases away from their trivial init so they are checked too
        for name, p in hf.named_parameters():
            if "norm" in name or "bias" in name:
                p.add_(0.2 * torch.randn_like(p))
    x = torch.randint(0, 97, (2, 11))
    with torch.no_grad():
        ref = hf(x).logits
        ours = from_hf_difflama(hf).eval()
        assert ours.config.num_kv_heads == kv_heads and ours.config.tie_embeddings == tie
        assert torch.allclose(ours(x), ref, atol=1e-5)
        for block in ours.blocks:  # a learned per-head norm weight, which DiffLlama folds into o_proj
            block.attn.sub_norm.weight.normal_(1.0, 0.3)
        back = to_hf_difflama(ours).eval()
        assert torch.allclose(back(x).logits, ours(x), atol=1e-5)
        # the head permutation matters: copying the projections unpermuted changes the logits
        naive = diffzoo_state_dict_to_hf(ours.state_dict(), ours.config)
        for key in [k for k in naive if "q_proj.weight" in k]:
            naive[key] = ours.state_dict()[key.replace("model.layers", "blocks").replace("self_attn.", "attn.")]
        back.load_state_dict(naive, strict=False)
        assert not torch.allclose(back(x).logits, ours(x), atol=1e-3)


def test_difflama_converter_refuses_what_it_cannot_express() -> None:
    pytest.importorskip("transformers")
    from diffzoo.weights.hf_difflama import to_hf_difflama

    with pytest.raises(ValueError, match="attn='softmax'"):
        to_hf_difflama(tiny("softmax"))


# -- text data -----------------------------------------------------------------------------------
def test_tokenized_memmap_file(tmp_path) -> None:
    text = "Differential attention cancels noise. ünïcode\n" * 20
    corpus = tmp_path / "c.txt"
    corpus.write_text(text, encoding="utf-8")
    path = tokenize_corpus(str(corpus), "byte", tmp_path / "cache")
    tokens = load_tokens(path)
    assert isinstance(tokens, np.memmap) and tokens.dtype == np.uint8
    assert bytes(tokens.tolist()) == text.encode("utf-8")
    mtime = path.stat().st_mtime_ns
    assert tokenize_corpus(str(corpus), "byte", tmp_path / "cache") == path and path.stat().st_mtime_ns == mtime
    corpus.write_text(text + "more", encoding="utf-8")  # a changed corpus gets a new file
    assert tokenize_corpus(str(corpus), "byte", tmp_path / "cache") != path
    ds = TokenWindows(path, seq_len=16)
    x, y = ds[5]
    assert x.dtype == torch.int64 and torch.equal(x[1:], y[:-1]) and bytes(x.tolist()) == text.encode()[5:21]


def test_corpus_errors(tmp_path) -> None:
    with pytest.raises(FileNotFoundError, match="does not exist"):
        tokenize_corpus(str(tmp_path / "missing.txt"), "byte", tmp_path)
    (tmp_path / "empty.txt").write_text("  \n")
    with pytest.raises(ValueError, match="is empty"):
        tokenize_corpus(str(tmp_path / "empty.txt"), "byte", tmp_path)
    (tmp_path / "short.txt").write_text("too short")
    with pytest.raises(ValueError, match="cannot fill"):
        TokenWindows(tokenize_corpus(str(tmp_path / "short.txt"), "byte", tmp_path), seq_len=64)
    with pytest.raises(ValueError, match="tokenizer"):
        TextDataModule(tokenizer="no-such-tokenizer.json")


def test_embedded_corpus_is_real_english() -> None:
    text = pydoc_topics_text()
    assert len(text) > 400_000 and "The \"for\" statement" in text and text.count(" the ") > 3000


def test_window_order_depends_only_on_seed_and_epoch(tmp_path) -> None:
    corpus = tmp_path / "c.txt"
    corpus.write_text("".join(chr(97 + i % 26) for i in range(5000)))
    ds = TokenWindows(tokenize_corpus(str(corpus), "byte", tmp_path), seq_len=32)
    a, b = RandomWindowSampler(ds, 40, seed=3), RandomWindowSampler(ds, 40, seed=3)
    b.set_epoch(1)
    assert list(a) == list(RandomWindowSampler(ds, 40, seed=3)) and len(list(a)) == 40
    assert list(a) != list(b) and list(a) != list(RandomWindowSampler(ds, 40, seed=4))
    mixed = RandomWindowSampler(ds, 400, seed=0, needle_fraction=0.5)
    share = sum(s >= 0 for _, s in mixed) / 400
    assert 0.4 < share < 0.6


# -- needles and scores --------------------------------------------------------------------------
def test_needle_sample_spans() -> None:
    tok = ByteTokenizer()
    filler = np.frombuffer(b"lorem ipsum dolor sit amet " * 40, dtype=np.uint8)
    for depth in (0.0, 0.5, 1.0):
        s = make_needle_sample(filler, tok, 200, 3, depth, np.random.default_rng(1))
        text = tok.decode(s.tokens.tolist())
        assert len(s.tokens) == 200 and s.answer[1] == 200
        answer = tok.decode(s.tokens[s.answer[0]:].tolist())
        assert tok.decode(s.tokens[s.value[0]:s.value[1]].tolist()) == answer and answer.isdigit()
        names = [tok.decode(s.tokens[a:b].tolist()).split()[3] for a, b in s.needles]
        assert len(set(names)) == 3
        assert tok.decode(s.tokens[s.needles[0][0]:s.needles[0][1]].tolist()) == needle_text(names[0], answer)
        assert tok.decode(s.tokens[s.query[0]:s.query[1]].tolist()) == query_text(names[0])
        assert text.count(f"key of {names[0]} is {answer}") == 2  # the needle and the query + answer
        noise = s.noise_mask()
        assert not noise[s.value[0]:s.value[1]].any() and not noise[s.query[0]:].any()
        assert int(noise.sum()) == s.query[0] - sum(b - a for a, b in s.needles)
        if depth == 0.0:
            assert s.needles[0][0] == 0
        if depth == 1.0:
            assert s.needles[0][1] == s.query[0]
    with pytest.raises(ValueError, match="too short"):
        make_needle_sample(filler, tok, 60, 3, 0.5, np.random.default_rng(0))


def test_recall_window_asks_for_values_planted_earlier() -> None:
    filler = np.frombuffer(b"lorem ipsum dolor sit amet " * 40, dtype=np.uint8)
    rng = np.random.default_rng(3)
    for letters, digits in ((3, 3), (1, 2)):
        for _ in range(10):
            w = recall_window(filler, 129, rng, needles=4, queries=3, letters=letters, digits=digits)
            raw = bytes(w.tokens.astype(np.uint8))
            assert len(raw) == 129 and w.tokens.dtype == np.int64 and len(w.answers) == 3
            assert w.answers[-1][1] == 129  # the last answer ends the window
            for s, e in w.answers:
                key = raw[s - letters - 2 : s]  # "\nABC="
                assert key[:1] == b"\n" and key[1:-1].isalpha() and key.endswith(b"=") and raw[s:e].isdigit()
                assert e - s == digits and raw.count(b" " + key[1:] + raw[s:e] + b". ") == 1  # its needle
            for smp, (s, e) in zip(w.samples(), w.answers):  # one scoring sample per answer, spans consistent
                needle = raw[smp.needles[0][0] : smp.needles[0][1]]
                assert smp.answer == (s, e) and raw[smp.value[0] : smp.value[1]] == raw[s:e]
                assert needle == b" " + raw[smp.query[0] + 1 : smp.query[1]] + raw[s:e] + b". "
                assert smp.num_needles == 4 and len(smp.needles) == 4 and len(set(smp.needles)) == 4
                assert int(smp.noise_mask().sum()) == smp.query[0] - sum(b - a for a, b in smp.needles)
    # every question asks a needle drawn from all of them: the last is often one asked before, so it cannot be
    # answered by elimination (asked without repeats it never would be), and each needle is asked last
    last = [recall_window(filler, 129, rng, needles=4, queries=4) for _ in range(400)]
    repeated = np.mean([w.asked[-1] in w.asked[:-1] for w in last])
    assert 0.45 < repeated < 0.72  # 1 - (3/4)^3 = 0.58 expected
    assert np.bincount([w.asked[-1] for w in last], minlength=4).min() > 60
    with pytest.raises(ValueError, match="more than 40"):
        recall_window(filler, 40, rng, needles=4, queries=4)
    with pytest.raises(ValueError, match="queries=5"):
        recall_window(filler, 129, rng, needles=4, queries=5)


def test_attention_scores_on_hand_built_maps() -> None:
    # 6 keys: 0-1 noise, 2-3 answer, 4 other, 5 query token; one query row (token 5), one layer
    query = torch.tensor([[False] * 5 + [True]])
    answer = torch.tensor([[False, False, True, True, False, False]])
    noise = torch.tensor([[True, True, False, False, False, False]])
    soft = torch.zeros(1, 2, 6, 6)
    soft[0, :, 5] = torch.tensor([0.1, 0.2, 0.25, 0.25, 0.1, 0.1])
    s_ans, s_noise = attention_scores([{"attn": soft}], query, answer, noise)
    assert s_ans.item() == pytest.approx(0.5) and s_noise.item() == pytest.approx(0.3)
    a1, a2 = torch.zeros(1, 1, 6, 6), torch.zeros(1, 1, 6, 6)
    a1[0, 0, 5] = torch.tensor([0.2, 0.2, 0.3, 0.3, 0.0, 0.0])
    a2[0, 0, 5] = torch.tensor([0.4, 0.4, 0.1, 0.1, 0.0, 0.0])
    # a = a1 - 0.5 a2 = [0, 0, .25, .25, 0, 0], row sum 1 - 0.5: all attention on the answer, none on noise
    s_ans, s_noise = attention_scores([{"attn1": a1, "attn2": a2, "lambda": torch.tensor(0.5)}], query, answer, noise)
    assert s_ans.item() == pytest.approx(1.0) and s_noise.item() == pytest.approx(0.0, abs=1e-7)
    # per-token-and-head lambda (V2) and the average over layers
    lam = torch.full((1, 1, 6), 0.5)
    both = attention_scores([{"attn": soft[:, :1]}, {"attn1": a1, "attn2": a2, "lambda": lam}], query, answer, noise)
    assert both[0].item() == pytest.approx(0.75) and both[1].item() == pytest.approx(0.15)


class _Oracle(torch.nn.Module):
    """Predicts the true next token (or always token 0) and attends uniformly: checks the accuracy path.

    Its one attention layer has zero query/key projections, so every query spreads its attention evenly
    over the keys the causal mask allows; :func:`evaluate_retrieval` records those maps.
    """

    def __init__(self, right: bool) -> None:
        super().__init__()
        self.right = right
        self.attn = Attention(8, 1, causal=True)
        torch.nn.init.zeros_(self.attn.q_proj.weight)
        torch.nn.init.zeros_(self.attn.k_proj.weight)

    def forward(self, tokens):
        B, N = tokens.shape
        self.attn(torch.ones(B, N, 8))
        target = torch.roll(tokens, -1, 1) if self.right else torch.zeros_like(tokens)
        return torch.nn.functional.one_hot(target, 256).float()


def test_retrieval_evaluation_counts_exact_matches() -> None:
    filler = np.frombuffer(pydoc_topics_text()[:5000].encode(), dtype=np.uint8)
    tok = ByteTokenizer()
    kw = dict(lengths=(64, 128), needle_counts=(1, 4), depths=(0.0, 1.0), samples=3)
    rows = evaluate_retrieval(_Oracle(True), filler, tok, **kw)
    assert {(r["length"], r["needles"]) for r in rows} == {(64, 1), (128, 1), (128, 4)}  # 4 needles > 64 tokens
    assert all(r["accuracy"] == 1.0 and r["n"] == 3 for r in rows)
    assert all(0 < r["score_answer"] < 1 and 0 <= r["score_noise"] < 1 for r in rows)
    assert all(r["accuracy"] == 0.0 for r in evaluate_retrieval(_Oracle(False), filler, tok, **kw))
    real = evaluate_retrieval(tiny(vocab_size=256), filler, tok, lengths=(64,), needle_counts=(1,), depths=(0.5,), samples=2)
    assert len(real) == 1 and np.isfinite(real[0]["score_answer"])

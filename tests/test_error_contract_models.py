"""The error contract over the models and training code: `transformer`, `memory`, `adaptive`, `tasks`,
`train`, `arena`, `rl`, `text`, `hsoftmax`, `testing`, `utils` and `ablations`.

Every bad call raises ``ValueError``/``TypeError`` whose message names the public argument (and the
value or shape seen); NaN fails every range check; flags must be bools; token ids are checked before
an embedding; a batch of 0 gives empty results and gradients; NumPy integers work wherever Python
ints do. Tables drive the tests, as in tests/test_error_contract.py.
"""
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from xfam_lib import ablations, adaptive, arena, hsoftmax, memory, rl, tasks, testing, text, train, utils
from xfam_lib import transformer as T
from xfam_lib.positional import XLRelativeAttention
from xfam_lib.ssm import selective_scan

from bad_input import check_bad_input   # tests/bad_input.py

NAN = float("nan")
torch.manual_seed(0)
VOCAB = 12
LM = T.TransformerLM(VOCAB, 16, 1, 2).eval()
ED = T.EncoderDecoder(VOCAB, 16, 2, 1, 1, 32).eval()
MEX = adaptive.MultiExitModel(VOCAB, 16, 2, 32, 2)
DT = rl.DecisionTransformer(3, 2, d_model=16)
GPT = text.CharGPT(VOCAB, 16, 1, 2, 8)
XL = memory.TransformerXL(VOCAB, 16, 1, 2, 32, 4)
ARENA = arena.ArenaLM("softmax", VOCAB, 16, 1)
CORPUS = text.CharCorpus("ab" * 20, "ab", torch.tensor([0, 1] * 18), torch.tensor([0, 1] * 2))


def ids(b=2, length=5, low=0, high=VOCAB):
    return torch.randint(low, high, (b, length), generator=torch.Generator().manual_seed(b * 7 + length))


def small_loss(model, step):
    x = torch.randn(8, 4, generator=torch.Generator().manual_seed(step))
    return ((model(x) - x.sum(-1, keepdim=True)) ** 2).mean()


def dt_call(b=1, actions=None):
    actions = torch.zeros(b, 4, dtype=torch.long) if actions is None else actions
    return DT(torch.zeros(b, 4), torch.zeros(b, 4, 3), actions, torch.zeros(b, 4, dtype=torch.long))


# (name, call, exception, words the message must contain: the argument and what it got)
BAD = [
    # silent before: now an error
    ("cross_entropy, negative target without ignore_index",
     lambda: train.cross_entropy(torch.randn(3, 4), torch.tensor([-1, 0, 1])), ValueError, "targets must be in [0, V=4)"),
    ("train_loop, grad_clip=-1", lambda: train.train_loop(torch.nn.Linear(4, 1), small_loss, steps=2, lr=0.1,
                                                         grad_clip=-1, progress=False), ValueError, "grad_clip"),
    ("train_char_lm, grad_clip=-1", lambda: text.train_char_lm(GPT, CORPUS, steps=1, batch=2,
                                                               lr=0.1, seed=0, grad_clip=-1), ValueError, "grad_clip"),
    ("check_equal_answer_counts, world does not divide the batch",
     lambda: arena.check_equal_answer_counts(torch.ones(4, 6, dtype=torch.long), 3), ValueError, "world=3"),
    ("DecoderLayer, memory=None", lambda: T.DecoderLayer(16, 2, 32)(torch.randn(1, 3, 16), None),
     TypeError, "memory must be a torch.Tensor"),
    ("DecoderLayer, memory of another width", lambda: T.DecoderLayer(16, 2, 32)(torch.randn(1, 3, 16),
                                                                              torch.randn(1, 4, 8)),
     ValueError, "memory must be (B=1, S, d=16)"),
    ("embed_onehot, 1-D weight", lambda: T.embed_onehot(torch.tensor([0, 1]), torch.randn(3)),
     ValueError, "weight must have 2 dims"),
    ("embed_onehot, id beyond the table", lambda: T.embed_onehot(torch.tensor([0, 5]), torch.randn(3, 2)),
     ValueError, "ids must be in [0, weight.shape[0]=3)"),
    ("shift_right, bos_id=1.5", lambda: T.shift_right(torch.zeros(1, 3, dtype=torch.long), 1.5),
     TypeError, "bos_id must be an int, got 1.5"),
    ("layer_norm, complex x", lambda: T.layer_norm(torch.randn(2, 4, dtype=torch.cfloat)),
     TypeError, "x must be a floating-point"),
    ("layer_norm, weight of another width", lambda: T.layer_norm(torch.randn(2, 4), torch.ones(3)),
     ValueError, "weight must end in the feature size d=4"),
    ("cross_entropy, complex logits", lambda: train.cross_entropy(torch.randn(3, 4, dtype=torch.cfloat),
                                                                 torch.tensor([0, 1, 2])),
     TypeError, "logits must be a floating-point"),
    ("get_batch, float ids", lambda: text.get_batch(torch.rand(100), 2, 4), TypeError, "ids must be integer"),
    # sizes and hyper-parameters that make no sense
    ("FeedForward(0, 16)", lambda: T.FeedForward(0, 16), ValueError, "d_model must be positive, got 0"),
    ("FeedForward, input of another width", lambda: T.FeedForward(8, 16)(torch.randn(2, 4)),
     ValueError, "x must end in the feature size d=8, got shape (2, 4)"),
    ("RMSNorm(0)", lambda: T.RMSNorm(0), ValueError, "d must be positive, got 0"),
    ("RMSNorm(eps=-1)", lambda: T.RMSNorm(4, eps=-1), ValueError, "eps must be in [0, inf)"),
    ("layer_norm, eps=-1", lambda: T.layer_norm(torch.randn(2, 4), eps=-1), ValueError, "eps must be in [0, inf)"),
    ("batch_norm, eps=-1", lambda: T.batch_norm(torch.randn(2, 4), eps=-1), ValueError, "eps must be in [0, inf)"),
    ("SwiGLU(8, 0)", lambda: T.SwiGLU(8, 0), ValueError, "hidden must be positive, got 0"),
    ("TransformerLM(max_len=0)", lambda: T.TransformerLM(VOCAB, 16, 1, 2, positional="learned", max_len=0),
     ValueError, "max_len must be positive, got 0"),
    ("TransformerLM(rope_base=0)", lambda: T.TransformerLM(VOCAB, 16, 1, 2, rope_base=0), ValueError, "rope_base"),
    ("ffn_hidden_size(dim=64.5)", lambda: T.ffn_hidden_size(64.5, 16),
     TypeError, "dim must be a positive int, got 64.5"),
    ("ffn_hidden_size, multiplier -1", lambda: T.ffn_hidden_size(64, 16, -1), ValueError, "ffn_dim_multiplier"),
    ("ffn_hidden_size(multiple_of=0)", lambda: T.ffn_hidden_size(64, 0), ValueError, "multiple_of must be positive"),
    ("act_halting, p = 2", lambda: adaptive.act_halting(lambda s, n: (s, torch.full(s.shape[:-1], 2.0)),
                                                       torch.randn(2, 4)), ValueError, "p must lie in [0, 1]"),
    ("act_halting, p = -0.5", lambda: adaptive.act_halting(lambda s, n: (s, torch.full(s.shape[:-1], -0.5)),
                                                          torch.randn(2, 4)), ValueError, "p must lie in [0, 1]"),
    ("SizePreset('cpu', 0)", lambda: utils.SizePreset("cpu", 0), ValueError, "scale must be positive, got 0"),
    ("SizePreset.n(multiple=0)", lambda: utils.SizePreset("cpu", 1).n(8, 0), ValueError, "multiple must be positive"),
    ("resolve_scale, d_k=0", lambda: utils.resolve_scale(None, 0), ValueError, "d_k"),
    ("decay_groups(weight_decay=-1)", lambda: text.decay_groups(torch.nn.Linear(2, 2), -1),
     ValueError, "weight_decay must be in [0, inf)"),
    # token ids checked before every embedding, naming the ids and the vocabulary
    ("TransformerLM, float ids", lambda: LM(ids().float()), TypeError, "ids must be integer token ids"),
    ("TransformerLM, ids >= vocab", lambda: LM(ids() + VOCAB), ValueError, f"ids must be in [0, vocab={VOCAB})"),
    ("TransformerLM, ids < 0", lambda: LM(ids() - VOCAB), ValueError, f"ids must be in [0, vocab={VOCAB})"),
    ("EncoderDecoder, src >= vocab", lambda: ED(ids() + VOCAB, ids()),
     ValueError, f"src must be in [0, vocab={VOCAB})"),
    ("EncoderDecoder, tgt_in >= vocab", lambda: ED(ids(), ids() + VOCAB), ValueError, "tgt_in must be in"),
    ("EncoderStackLM, ids >= vocab", lambda: T.EncoderStackLM(VOCAB, 16, 2, 32, 1)(ids() + VOCAB),
     ValueError, "ids must be in"),
    ("CharGPT, ids >= vocab", lambda: GPT(ids() + VOCAB), ValueError, "ids must be in"),
    ("TransformerXL, ids >= vocab", lambda: XL(ids() + VOCAB), ValueError, "ids must be in"),
    ("MultiExitModel, ids >= vocab", lambda: MEX(ids() + VOCAB), ValueError, "ids must be in"),
    ("ArenaLM, ids >= vocab", lambda: arena.ArenaLM("softmax", VOCAB)(ids() + VOCAB), ValueError, "ids must be in"),
    ("CueRecallNet, tokens >= vocab", lambda: rl.CueRecallNet(VOCAB, 4, 5, depth=1)(ids() + VOCAB),
     ValueError, "tokens must be in"),
    ("ablations.RecallNet, ids >= vocab", lambda: ablations.RecallNet(VOCAB, 16)(ids() + VOCAB),
     ValueError, "ids must be in"),
    ("generate, prompt >= vocab", lambda: T.generate(LM, ids() + VOCAB, 2), ValueError, "prompt must be in"),
    ("generate, empty prompt", lambda: T.generate(LM, ids(2, 0), 2), ValueError, "prompt must hold at least one"),
    ("beam_search, eos_id=99", lambda: T.beam_search(ED, ids(1), 1, 3, eos_id=99),
     ValueError, "eos_id must be an int in"),
    ("greedy_decode, bos_id >= vocab", lambda: T.greedy_decode(ED, ids(), VOCAB, 3), ValueError, "bos_id"),
    ("teacher_forcing_loss, tgt >= vocab", lambda: T.teacher_forcing_loss(ED, ids(), ids() + VOCAB, 1),
     ValueError, "tgt must be in"),
    ("DecisionTransformer, actions >= act_dim", lambda: dt_call(actions=torch.full((1, 4), 5)),
     ValueError, "actions must be in [0, act_dim=2)"),
    ("reinforce_loss, actions >= A",
     lambda: rl.reinforce_loss(torch.randn(1, 2, 2), torch.zeros(1, 2), torch.full((1, 2), 5), torch.zeros(1, 2)),
     ValueError, "actions must be in [0, A"),
    ("cross_entropy, target >= V", lambda: train.cross_entropy(torch.randn(3, 4), torch.tensor([0, 1, 9])),
     ValueError, "targets must be in [0, V=4), got ids in [0, 9]"),
    ("multi_exit_loss, target >= C", lambda: adaptive.multi_exit_loss(torch.randn(2, 3, 4), torch.tensor([0, 1, 9])),
     ValueError, "targets must be in [0, C=4)"),
    ("hsoftmax_prob_loop, word out of range",
     lambda: hsoftmax.hsoftmax_prob_loop(torch.randn(4), hsoftmax.huffman_tree([1, 2, 3]), torch.randn(2, 4), 3),
     ValueError, "word must be an int in [0, 2]"),
    # None and the wrong class reach attribute access no more
    ("exact_knn(None)", lambda: memory.exact_knn(None, torch.randn(4, 2), 1), TypeError, "q must be a torch.Tensor"),
    ("ssm.selective_scan(u=None)", lambda: selective_scan(None, torch.rand(1, 4, 10), -torch.rand(4, 3),
                                                           torch.randn(1, 3, 10), torch.randn(1, 3, 10)),
     TypeError, "u must be a torch.Tensor"),
    ("cross_entropy(None)", lambda: train.cross_entropy(None, torch.tensor([0])),
     TypeError, "logits must be a torch"),
    ("ArenaLM(None)", lambda: arena.ArenaLM("softmax", 8)(None), TypeError, "ids must be a torch.Tensor"),
    ("teacher_forcing_loss, a TransformerLM", lambda: T.teacher_forcing_loss(LM, ids(), ids(), 1),
     TypeError, "model must be an instance of EncoderDecoder, got TransformerLM"),
    ("greedy_decode, a TransformerLM", lambda: T.greedy_decode(LM, ids(), 1, 3),
     TypeError, "model must be an instance"),
    ("generate, an EncoderDecoder", lambda: T.generate(ED, ids(), 3),
     TypeError, "model must be an instance of TransformerLM"),
    ("decode_state_bytes, a TransformerLM", lambda: arena.decode_state_bytes(LM, 4),
     TypeError, "model must be an instance of ArenaLM"),
    ("mixer_step, a Linear", lambda: arena.mixer_step(torch.nn.Linear(2, 2), torch.randn(1, 2), None),
     TypeError, "mixer must be one of an ArenaLM's mixers"),
    ("gpt2_init, a Linear", lambda: text.gpt2_init(torch.nn.Linear(2, 2)),
     TypeError, "model must be an instance of CharGPT"),
    ("rollout, a TransformerLM", lambda: rl.rollout(LM, rl.ChainMDP(), 3.0), TypeError, "model must be an instance"),
    ("stream_logits, a TransformerLM", lambda: ablations.stream_logits(LM, ids(), 2),
     TypeError, "model must be an instance"),
    ("copy_from_torch_layer, a Linear", lambda: testing.copy_from_torch_layer(T.EncoderLayer(8, 2, 16),
                                                                             torch.nn.Linear(2, 2)),
     TypeError, "theirs must be an instance"),
    ("copy_from_torch_layer, an encoder layer for a decoder one",
     lambda: testing.copy_from_torch_layer(T.EncoderLayer(8, 2, 16), torch.nn.TransformerDecoderLayer(8, 2, 16)),
     TypeError, "ours must be a decoder layer"),
    # caches shorter than the layers
    ("Decoder, cache of 0 layers", lambda: ED.decode(ids(), ED.encode(ids()), ids(), cache=[]),
     ValueError, "cache must hold one entry per layer (1"),
    ("TransformerLM, cache of 0 layers", lambda: LM(ids(), cache=[]),
     ValueError, "cache must hold one entry per layer"),
    ("TransformerXL, mems of 2 layers", lambda: XL(ids(), [None, None]),
     ValueError, "mems must hold one memory per layer"),
    # other argument checks
    ("accuracy, a list", lambda: tasks.accuracy([1, 2], torch.zeros(1, 2)), TypeError, "pred must be a torch.Tensor"),
    ("offset_copy, offset 0", lambda: tasks.offset_copy(2, 5, 8, offsets=(0,)),
     ValueError, "offsets must be distinct"),
    ("noam_lr(step=0)", lambda: train.noam_lr(0, 64, 10), ValueError, "step must be an int >= 1, got 0"),
    ("seed_everything(-1)", lambda: utils.seed_everything(-1), ValueError, "seed must be an int >= 0, got -1"),
    ("seed_everything(1.5)", lambda: utils.seed_everything(1.5), TypeError, "seed must be an int, got 1.5"),
    ("train_loop, loss_fn returns a float", lambda: train.train_loop(torch.nn.Linear(4, 1), lambda m, s: 1.0,
                                                                     steps=1, lr=0.1, progress=False),
     TypeError, "loss_fn must return a one-element loss tensor"),
    ("calibrate_threshold, no tokens", lambda: adaptive.calibrate_threshold(torch.zeros(0, 2), torch.zeros(0, 2), 0.1),
     ValueError, "conf must hold at least one"),
    ("check_causal, position=1.5", lambda: testing.check_causal(lambda x: x, torch.randn(4, 2), position=1.5),
     TypeError, "position must be an int"),
    ("mc_variance, std=-1", lambda: testing.mc_variance(4, std=-1.0), ValueError, "std must be in [0, inf)"),
    ("knn_augmented_attention, topk=0", lambda: memory.knn_augmented_attention(
        *(torch.randn(1, 2, 4, 8) for _ in range(3)), torch.randn(1, 2, 6, 8), torch.randn(1, 2, 6, 8), 0,
        torch.zeros(2)), ValueError, "topk must be positive, got 0"),
    ("SpalmGate, h of another width", lambda: memory.SpalmGate(8)(torch.randn(2, 4), torch.randn(2, 3, 4)),
     ValueError, "h must be (..., d_model=8)"),
    ("GRUGate, y=None", lambda: rl.GRUGate(4)(torch.randn(2, 4), None), TypeError, "y must be a torch.Tensor"),
    ("multi_exit_loss, NaN weight", lambda: adaptive.multi_exit_loss(torch.randn(2, 3, 4), torch.tensor([0, 1, 2]),
                                                                     [1.0, NAN]), ValueError, "weights must be finite"),
    ("sample_text, prompt outside the vocabulary", lambda: text.sample_text(GPT, CORPUS, "abz", 2),
     ValueError, "prompt contains characters outside"),
    ("cyclic_permutation, seed=0.5", lambda: tasks.cyclic_permutation(4, seed=0.5), TypeError, "seed must be an int"),
    ("train_arena, lr=nan", lambda: arena.train_arena("softmax", lr=NAN), ValueError, "lr must be in (0, inf)"),
    ("train_arena, patience=0", lambda: arena.train_arena("softmax", patience=0), ValueError, "patience"),
    ("train_arena, eval_every=0", lambda: arena.train_arena("softmax", eval_every=0), ValueError, "eval_every"),
    ("train_arena, min_delta=nan", lambda: arena.train_arena("softmax", min_delta=NAN), ValueError, "min_delta"),
    ("mqar_zoology, seq_len too short", lambda: tasks.mqar_zoology(2, 4, 40, 10), ValueError, "seq_len=10"),
    ("collect_offline_dataset, env of another class", lambda: rl.collect_offline_dataset(rl.TMaze(), 4),
     TypeError, "env must be an instance of ChainMDP"),
    ("tolerance_for, a float", lambda: testing.tolerance_for(torch.ones(1), 1.0),
     TypeError, "tensors must be a torch"),
    # a width mismatch is named before nn.Linear or nn.LayerNorm sees it
    ("GTrXLBlock, x of another width", lambda: rl.GTrXLBlock(16, 2)(torch.randn(1, 3, 8)), ValueError,
     "x must be (B, L, d_model=16), got shape (1, 3, 8)"),
    ("LSTMPolicy, obs of another width", lambda: rl.LSTMPolicy(4, 2)(torch.randn(1, 3, 5)), ValueError,
     "obs must be (B, T, obs_dim=4)"),
    ("TransformerPolicy, obs of another width", lambda: rl.TransformerPolicy(4, 2)(torch.randn(1, 3, 5)), ValueError,
     "obs must be (B, T, obs_dim=4)"),
    ("ExitPredictor, states of another width", lambda: adaptive.ExitPredictor(16, 2, "token")(torch.randn(2, 1, 3, 8)),
     ValueError, "states must be (N=2, B, L, d_model=16)"),
    ("XLLayer, h of another width", lambda: memory.XLLayer(16, 2, 32)(torch.randn(1, 3, 8)), ValueError,
     "h must be (B, L, d_model=16)"),
    ("mixer_step, x_t of another width", lambda: arena.mixer_step(ARENA.mixers[0], torch.randn(1, 8), None),
     ValueError, "x_t must be one token (B, d=16)"),
    ("EncoderDecoder, batches differ", lambda: ED(ids(2), ids(3)),
     ValueError, "src (B, S) and tgt_in (B, T) must share"),
    ("xl_attention, attn of another class", lambda: memory.xl_attention(torch.randn(1, 3, 16), None, torch.nn.Linear(2, 2)),
     TypeError, "attn must be an instance of XLRelativeAttention"),
]


@pytest.mark.parametrize("name,call,error,words", BAD, ids=[b[0] for b in BAD])
def test_bad_input_raises_a_clear_error_naming_the_argument(name, call, error, words):
    check_bad_input(name, call, error, words)


# ----------------------------------------------------------------------------- NaN fails every range check
NAN_CHECKS = {
    "generate temperature": lambda x: T.generate(LM, ids(), 2, temperature=x),
    "sample_decode temperature": lambda x: T.sample_decode(ED, ids(), 1, 2, temperature=x),
    "sample_text temperature": lambda x: text.sample_text(GPT, CORPUS, "a", 2, temperature=x),
    "first_exit threshold": lambda x: adaptive.first_exit(torch.rand(2, 3), x),
    "early_exit threshold": lambda x: MEX.early_exit(ids(), "softmax", x),
    "soft_span_mask z": lambda x: adaptive.soft_span_mask(torch.arange(4.0), x, 2.0),
    "soft_span_mask ramp": lambda x: adaptive.soft_span_mask(torch.arange(4.0), 1.0, x),
    "noam_lr factor": lambda x: train.noam_lr(1, 64, 10, factor=x),
    "reinforce_loss entropy_coef": lambda x: rl.reinforce_loss(torch.randn(1, 2, 2), torch.zeros(1, 2),
                                                               torch.zeros(1, 2, dtype=torch.long), torch.zeros(1, 2),
                                                               entropy_coef=x),
    "ArenaLM gate_bias": lambda x: arena.ArenaLM("gla", 8, gate_bias=x),
    "cross_entropy label_smoothing": lambda x: train.cross_entropy(torch.randn(3, 4), torch.tensor([0, 1, 2]),
                                                                   label_smoothing=x),
    "train_loop lr": lambda x: train.train_loop(torch.nn.Linear(4, 1), small_loss, steps=1, lr=x, progress=False),
    "EncoderLayer dropout": lambda x: T.EncoderLayer(16, 2, 32, dropout=x),
    "knn_lm_interpolate lam": lambda x: memory.knn_lm_interpolate(torch.rand(2, 4), torch.rand(2, 4), x),
    "returns_to_go gamma": lambda x: rl.returns_to_go(torch.rand(2, 4), x),
    "LaggedTopicLanguage p_rule": lambda x: tasks.LaggedTopicLanguage(p_rule=x),
}


@pytest.mark.parametrize("name", NAN_CHECKS)
def test_nan_fails_the_range_check(name):
    arg = name.split()[-1]
    with pytest.raises(ValueError, match=f"{arg} must be in .*got nan"):
        NAN_CHECKS[name](NAN)


@pytest.mark.parametrize("name,call", [
    ("geometric_exit_dist", lambda: adaptive.geometric_exit_dist(torch.tensor([0.5, NAN]))),
    ("calibrate_threshold", lambda: adaptive.calibrate_threshold(torch.full((4, 2), NAN),
                                                                 torch.ones(4, 2, dtype=torch.bool), 0.1)),
    ("act_halting", lambda: adaptive.act_halting(lambda s, n: (s, torch.full(s.shape[:-1], NAN)), torch.randn(2, 4))),
])
def test_nan_in_a_tensor_of_probabilities_fails(name, call):
    with pytest.raises(ValueError, match="halt_probs must lie|conf must not contain NaN|p must lie"):
        call()


# ----------------------------------------------------------------------------- flags are bools
FLAGS = {
    "EncoderLayer.forward causal": lambda f: T.EncoderLayer(16, 2, 32)(torch.randn(1, 3, 16), causal=f),
    "generate use_cache": lambda f: T.generate(LM, ids(), 2, use_cache=f),
    "greedy_decode use_cache": lambda f: T.greedy_decode(ED, ids(), 1, 2, use_cache=f),
    "EncoderStackLM causal": lambda f: T.EncoderStackLM(VOCAB, 16, 2, 32, 1, causal=f),
    "TransformerLM tie_weights": lambda f: T.TransformerLM(VOCAB, 16, 1, 2, tie_weights=f),
    "FeedForward bias": lambda f: T.FeedForward(4, 8, bias=f),
    "MultiExitModel causal": lambda f: adaptive.MultiExitModel(VOCAB, 16, 2, 32, 1, causal=f),
    "UniversalTransformer act": lambda f: adaptive.UniversalTransformer(16, 2, 32, 2, act=f),
    "AdaptiveSpanAttention.forward trim": lambda f: adaptive.AdaptiveSpanAttention(16, 2, 8)(torch.randn(1, 4, 16),
                                                                                          trim=f),
    "GTrXLBlock reorder": lambda f: rl.GTrXLBlock(16, 2, gate="residual", reorder=f),
    "DecisionTransformer discrete": lambda f: rl.DecisionTransformer(3, 2, discrete=f),
    "train_loop progress": lambda f: train.train_loop(torch.nn.Linear(4, 1), small_loss, steps=1, lr=0.1, progress=f),
    "xl_attention return_weights": lambda f: memory.xl_attention(torch.randn(1, 3, 16), None, XLRelativeAttention(16, 2),
                                                                 return_weights=f),
    "randn requires_grad": lambda f: testing.randn(2, gen=torch.Generator(), requires_grad=f),
}


@pytest.mark.parametrize("bad", ["yes", 1, None], ids=["str", "int", "None"])
@pytest.mark.parametrize("name", FLAGS)
def test_a_flag_must_be_a_bool(name, bad):
    arg = name.split()[-1]
    with pytest.raises(TypeError, match=f"{arg} must be a bool, got {bad!r}"):
        FLAGS[name](bad)


@pytest.mark.parametrize("name", ["generate use_cache", "EncoderLayer.forward causal", "FeedForward bias"])
def test_a_numpy_bool_is_a_bool(name):
    FLAGS[name](np.bool_(True))


# ----------------------------------------------------------------------------- batch 0 gives empty results and gradients
def _xl_attention(b):
    torch.manual_seed(0)
    return memory.xl_attention(torch.randn(b, 3, 16), torch.randn(b, 2, 16), XLRelativeAttention(16, 2))


BATCHED = {
    "generate": lambda b: T.generate(LM, ids(b), 3),
    "generate, sampled, no cache": lambda b: T.generate(LM, ids(b), 3, temperature=1.0, use_cache=False),
    "greedy_decode": lambda b: T.greedy_decode(ED, ids(b), 1, 3),
    "sample_decode, no cache": lambda b: T.sample_decode(ED, ids(b), 1, 3, use_cache=False),
    "xl_attention": _xl_attention,
    "TransformerXL": lambda b: XL(ids(b))[0],
    "DecisionTransformer": lambda b: dt_call(b),
    **{f"ArenaLM {family}": (lambda b, family=family: arena.ArenaLM(family, VOCAB, 16, 1)(ids(b)))
       for family in arena.FAMILIES + arena.BASELINES},
}


@pytest.mark.parametrize("name", BATCHED)
def test_a_batch_of_zero_gives_an_empty_result(name):
    full, empty = BATCHED[name](2), BATCHED[name](0)
    assert empty.shape == (0,) + full.shape[1:], f"{name}: {tuple(empty.shape)} for {tuple(full.shape)}"


@pytest.mark.parametrize("name", ["TransformerXL", "DecisionTransformer", "ArenaLM s4d", "ArenaLM h3", "ArenaLM mamba",
                                  "ArenaLM softmax"])
def test_a_batch_of_zero_gives_zero_gradients(name):
    """The backward pass of an empty batch runs and leaves every parameter a zero gradient."""
    torch.manual_seed(0)
    model = {"TransformerXL": lambda: memory.TransformerXL(VOCAB, 16, 1, 2, 32, 4),
             "DecisionTransformer": lambda: rl.DecisionTransformer(3, 2, d_model=16)}.get(
        name, lambda: arena.ArenaLM(name.split()[-1], VOCAB, 16, 1))()
    if name == "TransformerXL":
        out = model(ids(0))[0]
    elif name == "DecisionTransformer":
        out = model(torch.zeros(0, 4), torch.zeros(0, 4, 3), torch.zeros(0, 4, dtype=torch.long),
                    torch.zeros(0, 4, dtype=torch.long))
    else:
        out = model(ids(0))
    out.sum().backward()
    for pname, p in model.named_parameters():
        assert p.grad is not None and not p.grad.any(), f"{name}: {pname} has gradient {p.grad}"


def test_accuracy_of_nothing_is_nan():
    """A fraction of nothing is NaN, for every ``by``: no rows, or every target ignored."""
    empty = torch.zeros(0, 3, dtype=torch.long)
    assert math.isnan(tasks.accuracy(empty, empty, by="sequence"))
    assert math.isnan(tasks.accuracy(empty, empty, by="token"))
    assert tasks.accuracy(empty, empty, by="position").isnan().all()
    pad = torch.zeros(2, 3, dtype=torch.long)
    assert math.isnan(tasks.accuracy(pad + 1, pad, ignore_index=0))
    part = torch.tensor([[0, 2, 3], [0, 2, 4]])
    by_pos = tasks.accuracy(part, torch.tensor([[0, 2, 3], [0, 5, 3]]), by="position", ignore_index=0)
    assert by_pos[0].isnan() and by_pos[1:].tolist() == [0.5, 0.5]


# ----------------------------------------------------------------------------- NumPy integers work like Python ints
@pytest.mark.parametrize("name,call", [
    ("offset_copy", lambda i: tasks.offset_copy(2, 5, 8, offsets=(i(-1), i(1)), generator=torch.Generator())),
    ("noam_lr", lambda i: train.noam_lr(i(3), i(64), i(10))),
    ("hsoftmax_prob_loop", lambda i: hsoftmax.hsoftmax_prob_loop(torch.ones(4), hsoftmax.huffman_tree([1, 2, 3]),
                                                                 torch.ones(2, 4), i(1))),
    ("seed_everything", lambda i: (utils.seed_everything(i(3)), torch.rand(2))[1]),
    ("SizePreset.n", lambda i: utils.SizePreset("cpu", i(2)).n(i(12), i(8))),
    ("TransformerLM", lambda i: T.TransformerLM(i(VOCAB), i(16), i(1), i(2)).embed.weight.shape),
    ("copy_task", lambda i: tasks.copy_task(i(2), i(3), i(8), generator=torch.Generator())[0]),
    ("beam_search eos_id", lambda i: T.beam_search(ED, ids(1), i(1), i(3), eos_id=i(2))[0]),
])
def test_numpy_integers_are_accepted_like_python_ints(name, call):
    python, numpy = call(int), call(np.int64)
    pairs = zip(python, numpy) if isinstance(python, tuple) and isinstance(python[0], torch.Tensor) else [(python, numpy)]
    for a, b in pairs:
        assert torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b, f"{name}: {a} vs {b}"


# ----------------------------------------------------------------------------- declared meanings
def test_cross_entropy_ignore_index_may_lie_outside_the_classes():
    """A declared ``ignore_index`` may be any int (negative or >= V, as -100 or a PAD beyond the
    classes); the loss equals PyTorch's with that ``ignore_index``; the undeclared value is an error."""
    logits = torch.randn(5, 4, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    for ignore in (-100, -1, 4, 7, 0):
        targets = torch.tensor([0, ignore, 3, ignore, 2])
        testing.assert_close(train.cross_entropy(logits, targets, ignore_index=ignore),
                             F.cross_entropy(logits, targets, ignore_index=ignore))
    assert train.cross_entropy(logits, torch.full((5,), -1), ignore_index=-1) == 0      # every target ignored
    with pytest.raises(ValueError, match=r"or equal ignore_index=-100\), got ids in \[-1, 3\]"):
        train.cross_entropy(logits, torch.tensor([0, -1, 3, -100, 2]), ignore_index=-100)


def test_generate_and_decoders_check_the_ids_once_per_call(monkeypatch):
    """The token-id check (a host sync) runs once per call, at the entry point, never per token."""
    calls = []
    original = T.check_token_ids
    monkeypatch.setattr(T, "check_token_ids", lambda *a, **k: (calls.append(a[0]), original(*a, **k))[1])
    counts = []
    for new in (2, 6):
        calls.clear()
        T.generate(LM, ids(), new)
        T.greedy_decode(ED, ids(), 1, new)
        T.beam_search(ED, ids(1), 1, new, beam_size=2)
        counts.append(list(calls))
    assert counts[0] == counts[1], f"the checks grow with the number of tokens: {counts}"
    assert counts[0].count("prompt") == 1


def test_generate_calls_the_model_so_its_hooks_fire():
    """`generate` feeds every step through ``model(...)`` (chapter 1 times the steps with forward hooks)."""
    seen = []
    hook = LM.register_forward_pre_hook(lambda module, args: seen.append(tuple(args[0].shape)))
    try:
        T.generate(LM, ids(1, 3), 4)
    finally:
        hook.remove()
    assert seen == [(1, 3), (1, 1), (1, 1), (1, 1)]


# ----------------------------------------------------------------------------- property tests
@given(value=st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-10, 10)),
       low=st.one_of(st.none(), st.floats(-5, 5)), width=st.floats(0, 5), low_open=st.booleans())
@settings(max_examples=200, deadline=None)
def test_check_real_returns_only_finite_values_inside_the_interval(value, low, width, low_open):
    high = None if low is None else low + width
    try:
        got = utils.check_real("lam", value, low=low, high=high, low_open=low_open)
    except ValueError as err:
        assert "lam must be in" in str(err) and repr(float(value)) in str(err)
        inside = math.isfinite(value) and (low is None or (value > low if low_open else value >= low)) and \
            (high is None or value <= high)
        assert not inside
    else:
        assert math.isfinite(got) and got == value
        assert low is None or (got > low if low_open else got >= low)
        assert high is None or got <= high


@given(values=st.lists(st.integers(-4, VOCAB + 4), min_size=1, max_size=8))
@settings(max_examples=60, deadline=None)
def test_a_model_rejects_exactly_the_ids_outside_its_vocabulary(values):
    x = torch.tensor([values])
    if min(values) < 0 or max(values) >= VOCAB:
        with pytest.raises(ValueError, match=rf"ids must be in \[0, vocab={VOCAB}\), got ids in \[{min(values)}, "
                                             rf"{max(values)}\]"):
            LM(x)
    else:
        assert LM(x).shape == (1, len(values), VOCAB)


@given(targets=st.lists(st.integers(-3, 6), min_size=1, max_size=8), ignore=st.one_of(st.none(), st.integers(-3, 6)))
@settings(max_examples=80, deadline=None)
def test_cross_entropy_rejects_exactly_the_undeclared_targets_outside_the_classes(targets, ignore):
    V = 4
    logits = torch.randn(len(targets), V, generator=torch.Generator().manual_seed(len(targets)), dtype=torch.float64)
    t = torch.tensor(targets)
    bad = [x for x in targets if x != ignore and not 0 <= x < V]
    if bad:
        with pytest.raises(ValueError, match="targets must be in"):
            train.cross_entropy(logits, t, ignore_index=ignore)
    elif all(x == ignore for x in targets):
        assert train.cross_entropy(logits, t, ignore_index=ignore) == 0
    else:
        testing.assert_close(train.cross_entropy(logits, t, ignore_index=ignore),
                             F.cross_entropy(logits, t, ignore_index=-100 if ignore is None else ignore))


# ----------------------------------------------------------------------------- one set of validators
def test_one_set_of_validators_in_utils():
    """The modules use utils' validators; none keeps its own copy of a range or id check."""
    for module in (T, memory, adaptive, tasks, train, arena, rl, text, hsoftmax, testing, ablations):
        for name in ("check_tensor", "check_positive_int", "check_int", "check_real", "check_bool", "check_token_ids",
                     "check_instance"):
            if hasattr(module, name):
                assert getattr(module, name) is getattr(utils, name), f"{module.__name__}.{name} is a copy"
    assert not hasattr(memory, "_check_length") and not hasattr(adaptive, "_check_unit")

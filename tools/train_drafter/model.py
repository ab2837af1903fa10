"""The block drafter (DSpark / DeepSpec-DFlash) in PyTorch, written for this project from the DSpark
paper and ../shared/docs/DRAFTERS.md (sections 1.5, 2.3-2.8). Parameter names are those of
DeepSpec's Qwen3DSparkModel, so `state_dict()` is DeepSpec's published checkpoint layout.

Shapes: H hidden, nT taps, V vocab, r Markov rank, g block size (slots 0..g-1; slot k predicts
the token at anchor + k + 1).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    """Qwen3RMSNorm: normalise in float32, scale by the weight in the input's dtype."""

    def __init__(self, n: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dt = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dt)


def rope_tables(pos: torch.Tensor, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [..., head_dim] for integer positions (default rope, rotate-half layout)."""
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=pos.device, dtype=torch.int64).float() / head_dim))
    f = pos.float()[..., None] * inv
    emb = torch.cat([f, f], dim=-1)
    return emb.cos(), emb.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [b, heads, n, hd]; cos/sin [b, n, hd]."""
    h = x.shape[-1] // 2
    rot = torch.cat([-x[..., h:], x[..., :h]], dim=-1)
    return x * cos[:, None].to(x.dtype) + rot * sin[:, None].to(x.dtype)


class Attention(nn.Module):
    def __init__(self, c: dict):
        super().__init__()
        H, self.nh, self.nkv, self.hd = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
        self.q_proj = nn.Linear(H, self.nh * self.hd, bias=False)
        self.k_proj = nn.Linear(H, self.nkv * self.hd, bias=False)
        self.v_proj = nn.Linear(H, self.nkv * self.hd, bias=False)
        self.o_proj = nn.Linear(self.nh * self.hd, H, bias=False)
        self.q_norm = RMSNorm(self.hd, c["rms_norm_eps"])
        self.k_norm = RMSNorm(self.hd, c["rms_norm_eps"])

    def forward(self, x, ctx, rq, rk, mask):
        """x [b, Q, H] block rows; ctx [b, S, H] injected context features; rq/rk rope tables of
        the queries (block positions) and keys (context then block positions); mask [b, 1, Q, S+Q]
        (bool), or a FlexMask (the same pattern as a block-sparse mask, for flex_attention)."""
        b, Q, _ = x.shape
        kv_in = torch.cat([ctx, x], dim=1)
        q = self.q_norm(self.q_proj(x).view(b, Q, self.nh, self.hd)).transpose(1, 2)
        k = self.k_norm(self.k_proj(kv_in).view(b, -1, self.nkv, self.hd)).transpose(1, 2)
        v = self.v_proj(kv_in).view(b, -1, self.nkv, self.hd).transpose(1, 2)
        q, k = apply_rope(q, *rq), apply_rope(k, *rk)
        if isinstance(mask, FlexMask):
            # in v's dtype: the projections' (bf16 under autocast; the norms and RoPE promote q, k to float32)
            o = mask.attend(q.to(v.dtype), k.to(v.dtype), v, 1.0 / math.sqrt(self.hd))
            return self.o_proj(o.transpose(1, 2).reshape(b, Q, self.nh * self.hd))
        if self.nkv != self.nh:
            k = k.repeat_interleave(self.nh // self.nkv, dim=1)
            v = v.repeat_interleave(self.nh // self.nkv, dim=1)
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=1.0 / math.sqrt(self.hd))
        return self.o_proj(o.transpose(1, 2).reshape(b, Q, self.nh * self.hd))


class FlexMask:
    """The training forward's attention pattern for torch's flex_attention: block row q (anchor
    qa = anchors[q // g]) sees the context positions before its anchor and the rows of its own block;
    nothing else. Block-sparse: a tile of queries skips the context past its anchors and the other
    blocks, where the dense mask of `Drafter.train_forward` computes and discards them. Rows of
    dropped anchors (keep false; anchor 0) see their own block only: their outputs are never used.
    S, the context length, is padded by the caller to a multiple of 128 (fewer compiled shapes)."""

    _flex = None

    def __init__(self, anchors: torch.Tensor, keep: torch.Tensor, g: int, S: int):
        from torch.nn.attention.flex_attention import create_block_mask
        b, N = anchors.shape
        qa = torch.where(keep, anchors, torch.zeros_like(anchors)).repeat_interleave(g, dim=1)   # [b, Q]

        def mask_mod(bi, h, q, kv):
            ctx = (kv < S) & (kv < qa[bi, q])
            blk = (kv >= S) & ((kv - S) // g == q // g)
            return ctx | blk

        dev = anchors.device
        self.block_mask = create_block_mask(mask_mod, b, None, N * g, S + N * g, device=dev,
                                            _compile=dev.type == "cuda")

    def attend(self, q, k, v, scale: float):
        if FlexMask._flex is None:
            from torch.nn.attention.flex_attention import flex_attention
            if q.is_cuda:
                # one compiled kernel per (batch, context length) shape: --max-len 640 makes 5 lengths,
                # but past torch's recompile limit (8) it would fall back to eager (dense) flex_attention
                import torch._dynamo.config as dc
                for name in ("recompile_limit", "cache_size_limit"):
                    if hasattr(dc, name):
                        setattr(dc, name, max(getattr(dc, name), 64))
            FlexMask._flex = torch.compile(flex_attention, dynamic=False) if q.is_cuda else flex_attention
        return FlexMask._flex(q, k, v, block_mask=self.block_mask, scale=scale,
                              enable_gqa=k.shape[1] != q.shape[1])


class MLP(nn.Module):
    def __init__(self, c: dict):
        super().__init__()
        H, I = c["hidden_size"], c["intermediate_size"]
        self.gate_proj = nn.Linear(H, I, bias=False)
        self.up_proj = nn.Linear(H, I, bias=False)
        self.down_proj = nn.Linear(I, H, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Layer(nn.Module):
    def __init__(self, c: dict):
        super().__init__()
        self.self_attn = Attention(c)
        self.mlp = MLP(c)
        self.input_layernorm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])
        self.post_attention_layernorm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])

    def forward(self, x, ctx, rq, rk, mask):
        x = x + self.self_attn(self.input_layernorm(x), ctx, rq, rk, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class MarkovHead(nn.Module):
    """Vanilla Markov head: bias(prev) = W2 W1[prev] (DRAFTERS.md 2.6)."""

    def __init__(self, vocab: int, rank: int):
        super().__init__()
        self.markov_w1 = nn.Embedding(vocab, rank)
        self.markov_w2 = nn.Linear(rank, vocab, bias=False)


class ConfidenceHead(nn.Module):
    def __init__(self, n_in: int):
        super().__init__()
        self.proj = nn.Linear(n_in, 1)


class Drafter(nn.Module):
    """c: the drafter's config.json (dict, DeepSpec keys)."""

    def __init__(self, c: dict):
        super().__init__()
        self.c = c
        H, V = c["hidden_size"], c["vocab_size"]
        self.block_size = int(c["block_size"])
        self.mask_token_id = int(c["mask_token_id"])
        self.theta = float(c["rope_parameters"]["rope_theta"])
        self.embed_tokens = nn.Embedding(V, H)
        self.lm_head = nn.Linear(H, V, bias=False)
        self.fc = nn.Linear(len(c["target_layer_ids"]) * H, H, bias=False)
        self.hidden_norm = RMSNorm(H, c["rms_norm_eps"])
        self.layers = nn.ModuleList([Layer(c) for _ in range(c["num_hidden_layers"])])
        self.norm = RMSNorm(H, c["rms_norm_eps"])
        r = int(c["markov_rank"])
        self.markov_head = MarkovHead(V, r) if r > 0 else None
        self.confidence_head = None
        if c["enable_confidence_head"]:
            self.confidence_head = ConfidenceHead(H + (r if c["confidence_head_with_markov"] else 0))
        self.embed_tokens.requires_grad_(False)  # frozen copies of the target's (DeepSpec does the same)
        self.lm_head.requires_grad_(False)
        # training-time switches, not part of the config (the exported weights are the same):
        # flex: the training forward's attention through flex_attention (FlexMask);
        # fused_head: `logits` as one matmul of [h, W1[prev]] by [lm_head | W2], in the autocast dtype
        self.flex, self.fused_head = False, False

    def init_weights(self, seed: int, embed: torch.Tensor, head: torch.Tensor) -> None:
        g = torch.Generator().manual_seed(seed)
        for name, p in self.named_parameters():
            if name.endswith("norm.weight"):
                nn.init.ones_(p)
            elif name.endswith("bias"):
                nn.init.zeros_(p)
            elif name == "markov_head.markov_w2.weight":
                nn.init.zeros_(p)  # the Markov bias starts at zero and is learned
            else:
                with torch.no_grad():
                    p.copy_(torch.randn(p.shape, generator=g) * 0.02)
        with torch.no_grad():
            self.embed_tokens.weight.copy_(embed)
            self.lm_head.weight.copy_(head)

    # ------------------------------------------------------------------------------------
    def backbone(self, block_ids, block_pos, taps, ctx_pos, mask):
        """block_ids/block_pos [b, Q]; taps [b, S, nT*H]; ctx_pos [b, S]; mask [b, 1, Q, S+Q].
        Returns the normed block hidden states [b, Q, H]."""
        x = self.embed_tokens(block_ids)
        ctx = self.hidden_norm(self.fc(taps.to(self.fc.weight.dtype)))
        hd = self.c["head_dim"]
        rq = rope_tables(block_pos, hd, self.theta)
        rk = rope_tables(torch.cat([ctx_pos, block_pos], dim=1), hd, self.theta)
        for layer in self.layers:
            x = layer(x, ctx, rq, rk, mask)
        return self.norm(x)

    def markov_bias(self, prev_ids):
        return self.markov_head.markov_w2(self.markov_head.markov_w1(prev_ids))

    def confidence(self, h, prev_ids):
        feat = h
        if self.c.get("confidence_head_with_markov"):
            feat = torch.cat([h, self.markov_head.markov_w1(prev_ids).to(h.dtype)], dim=-1)
        return self.confidence_head.proj(feat).squeeze(-1).float()

    def train_forward(self, input_ids, taps, anchors, keep):
        """Teacher-forced block states at sampled anchors (DeepSpec's training forward).
        input_ids [b, T]; taps [b, T, nT*H]; anchors [b, N] (positions), keep [b, N] bool.
        Returns the block hidden states h [b, N, g, H], each slot's previous token prev [b, N, g]
        (the Markov head's input), labels [b, N, g] and label validity [b, N, g] (inside the
        sequence). The vocabulary-wide terms (logits) are left to `logits`, for the rows that count."""
        b, T = input_ids.shape
        N, g = anchors.shape[1], self.block_size
        dev = input_ids.device
        off = torch.arange(g, device=dev)
        block_ids = torch.full((b, N, g), self.mask_token_id, dtype=torch.long, device=dev)
        block_ids[:, :, 0] = torch.gather(input_ids, 1, anchors)
        block_pos = (anchors[:, :, None] + off).reshape(b, N * g)
        if self.flex:  # the context padded to a multiple of 128 (never visible): fewer compiled shapes
            S = -(-T // 128) * 128
            taps = F.pad(taps, (0, 0, 0, S - T))
            mask = FlexMask(anchors, keep, g, S)
        else:
            S = T
            qa = anchors.repeat_interleave(g, dim=1)                          # anchor of each query
            ctx_vis = torch.arange(T, device=dev)[None, None, :] < qa[:, :, None]   # [b, Q, T]
            qb = torch.arange(N * g, device=dev) // g
            blk_vis = (qb[:, None] == qb[None, :]).expand(b, -1, -1)          # [b, Q, Q]
            kq = keep.repeat_interleave(g, dim=1)[:, :, None]
            mask = (torch.cat([ctx_vis, blk_vis], dim=2) & kq) | ~kq   # dropped anchors: any row, masked later
            mask = mask[:, None]
        ctx_pos = torch.arange(S, device=dev).expand(b, S)
        h = self.backbone(block_ids.reshape(b, N * g), block_pos, taps, ctx_pos, mask)
        h = h.view(b, N, g, -1)
        lab_idx = anchors[:, :, None] + off + 1
        valid = lab_idx < T
        labels = torch.gather(input_ids[:, None, :].expand(b, N, T), 2, lab_idx.clamp(max=T - 1))
        prev = torch.cat([block_ids[:, :, :1], labels[:, :, :-1]], dim=2)
        return h, prev, labels, valid

    def logits(self, h, prev):
        """Markov-corrected draft logits [..., V] of block states h [..., H] whose previous tokens are
        prev [...]: float32, or the matmul's dtype with fused_head."""
        if self.fused_head and self.markov_head is not None:
            # one [M, V] product instead of two and their sum; left in the matmul's dtype (bf16 under
            # autocast): the loss (row_terms) reads it once, in float32
            w1 = self.markov_head.markov_w1(prev).to(h.dtype)
            w = torch.cat([self.lm_head.weight, self.markov_head.markov_w2.weight], dim=1)
            return F.linear(torch.cat([h, w1], dim=-1), w)
        z = self.lm_head(h).float()
        if self.markov_head is not None:
            z = z + self.markov_bias(prev).float()
        return z

    @torch.no_grad()
    def draft(self, ids, taps, start):
        """One greedy drafting round for a single sequence: ids [n] (tokens; ids[start] is the
        anchor), taps [start, nT*H] (context rows 0..start-1). Returns (drafts [g], corrected
        logits [g, V], confidence logits [g] or None)."""
        g, dev = self.block_size, ids.device
        block = torch.full((1, g), self.mask_token_id, dtype=torch.long, device=dev)
        block[0, 0] = ids[start]
        pos = torch.arange(start, start + g, device=dev)[None]
        ctx_pos = torch.arange(start, device=dev)[None]
        mask = torch.ones(1, 1, g, start + g, dtype=torch.bool, device=dev)
        h = self.backbone(block, pos, taps[None, :start], ctx_pos, mask)[0]
        base = self.lm_head(h).float()
        prev = ids[start]
        toks, zs, prevs = [], [], []
        for k in range(g):
            z = base[k]
            if self.markov_head is not None:
                z = z + self.markov_bias(prev[None])[0].float()
            prevs.append(prev)
            prev = torch.argmax(z)
            toks.append(prev)
            zs.append(z)
        toks = torch.stack(toks)
        conf = self.confidence(h, torch.stack(prevs)) if self.confidence_head is not None else None
        return toks, torch.stack(zs), conf


def row_terms(zp, zq, labels):
    """Per row of draft logits zp [M, V] and target logits zq [M, V]: the cross-entropy of the label
    and ||p_draft - p_target||_1. The vocabulary-wide part of the objective, in one function so that
    torch.compile can fuse it (compiled_row_terms) instead of writing five [M, V] float32 tensors."""
    lp = torch.log_softmax(zp.float(), dim=-1)
    ce = -lp.gather(1, labels[:, None])[:, 0]
    l1 = (lp.exp() - torch.softmax(zq.float(), dim=-1)).abs().sum(-1)
    return ce, l1


def dspark_loss(zp, zq, conf, labels, slot, g: int, *, decay: float, ce_w: float, tv_w: float, conf_w: float,
                terms=row_terms):
    """DeepSpec's objective (DRAFTERS.md 2.7, 2.11) over the rows that count (the valid prefix of each
    block: emask): draft logits zp [M, V], target logits zq [M, V], confidence logits conf [M] or None,
    labels [M], each row's slot [M] (0..g-1). Per-slot weights exp(-slot/decay); ce_w * CE(labels) +
    tv_w * ||p_draft - p_target||_1 + conf_w * BCE(confidence, 1 - TV). Returns (loss, stats dict of
    detached tensors, per-row acceptance estimate 1 - TV [M])."""
    w = torch.exp(-slot.float() / decay)
    den = w.sum().clamp_min(1e-6)
    ce_r, l1_r = terms(zp, zq, labels)
    acc = (1.0 - 0.5 * l1_r).clamp(0.0, 1.0)
    ce = (ce_r * w).sum() / den
    loss = ce_w * ce
    stats = {"ce": ce.detach()}
    if tv_w > 0:
        tv = (l1_r * w).sum() / den
        loss = loss + tv_w * tv
        stats["l1"] = tv.detach()
    if conf is not None and conf_w > 0:
        bce = (F.binary_cross_entropy_with_logits(conf, acc.detach(), reduction="none") * w).sum() / den
        loss = loss + conf_w * bce
        stats["conf_bce"] = bce.detach()
        stats["conf_abs_err"] = ((torch.sigmoid(conf) - acc).abs() * w).sum().detach() / den
    n = torch.zeros(g, device=zp.device).index_add_(0, slot, torch.ones_like(acc))
    stats["accept_rate_by_slot"] = (torch.zeros(g, device=zp.device).index_add_(0, slot, acc.detach()) / n.clamp_min(1))
    stats["loss"] = loss.detach()
    return loss, stats, acc.detach()


def compiled_row_terms(vocab: int, device, log=print):
    """row_terms through torch.compile (dynamic row count), or eager row_terms when compiling it
    fails (no compiler, an unsupported backend): tried once here, forward and backward, on a probe."""
    fn = torch.compile(row_terms, dynamic=True)
    try:
        for m in (5, 9):  # two row counts: the dynamic graph is made here, not in the first step
            zp = torch.randn(m, vocab, device=device, requires_grad=True)
            ce, l1 = fn(zp, torch.randn(m, vocab, device=device), torch.zeros(m, dtype=torch.long, device=device))
            (ce.sum() + l1.sum()).backward()
    except Exception as e:  # noqa: BLE001 - any failure: eager is the same function
        log(f"train: torch.compile of the loss failed ({type(e).__name__}: {str(e)[:300]}); eager")
        return row_terms
    return fn

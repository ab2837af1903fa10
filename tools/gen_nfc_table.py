#!/usr/bin/env python3
"""Generate src/tok/nfc_table.h: the Unicode data NFC needs, from Python's `unicodedata`.

Four tables (Hangul syllables are algorithmic and appear in none of them):
  nfc_ccc[]     cp << 8 | ccc for every code point whose canonical combining class is not 0, sorted;
  nfc_decomp[]  one uint64 per canonical decomposition mapping (one level, not recursive), sorted by
                cp: bits 42..62 the code point, 21..41 the first code point of its mapping, 0..20 the
                second (0 for a singleton), bit 63 set when the code point never appears in NFC
                (Full_Composition_Exclusion: singletons, non-starter decompositions, the exclusion
                list), which is exactly NFC_Quick_Check = No;
  nfc_comp[]    indices into nfc_decomp of the pairs that compose (bit 63 clear), sorted by
                (first << 21 | second);
  nfc_maybe[]   NFC_Quick_Check = Maybe: every code point that is the second of a composing pair,
                plus the Hangul medial vowels and final consonants, sorted;
  nfc_block[]   a bit per 256 code points: set when the block has a code point in any table above,
                so that the quick check of most text (CJK, Hangul syllables, ...) is one bit test.
The script cross-checks what it derives against unicodedata.normalize on every code point.

usage: tools/gen_nfc_table.py [--out src/tok/nfc_table.h]   (standard library only)
"""
import argparse
import os
import sys
import unicodedata

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
S_BASE, S_COUNT = 0xAC00, 11172
V_FIRST, V_LAST, T_FIRST, T_LAST = 0x1161, 0x1175, 0x11A8, 0x11C2


def canonical_mapping(cp):
    d = unicodedata.decomposition(chr(cp))
    if not d or d.startswith("<"):
        return None
    return [int(x, 16) for x in d.split()]


def build():
    ccc, decomp = [], []
    for cp in range(0x110000):
        if 0xD800 <= cp <= 0xDFFF:
            continue
        c = unicodedata.combining(chr(cp))
        if c:
            ccc.append((cp, c))
        if S_BASE <= cp < S_BASE + S_COUNT:
            continue
        m = canonical_mapping(cp)
        if m is None:
            continue
        assert 1 <= len(m) <= 2, (hex(cp), m)
        excluded = unicodedata.normalize("NFC", chr(cp)) != chr(cp)
        decomp.append((cp, m[0], m[1] if len(m) == 2 else 0, excluded))
    comp = sorted((i for i, e in enumerate(decomp) if not e[3]), key=lambda i: (decomp[i][1], decomp[i][2]))
    for i in comp:  # nfc.c relies on both
        assert decomp[i][2] != 0, "a singleton never composes"
        assert unicodedata.combining(chr(decomp[i][0])) == 0, "a composite is a starter"
    maybe = sorted({decomp[i][2] for i in comp} | set(range(V_FIRST, V_LAST + 1)) | set(range(T_FIRST, T_LAST + 1)))
    blocks = set()
    for cp, _ in ccc:
        blocks.add(cp >> 8)
    for cp, _, _, _ in decomp:
        blocks.add(cp >> 8)
    for cp in maybe:
        blocks.add(cp >> 8)
    return ccc, decomp, comp, maybe, blocks


def check(ccc, decomp, comp, maybe):
    """What the C code will do, in Python, against unicodedata.normalize on every code point."""
    ccc_of = dict(ccc)
    dmap = {cp: (a, b) for cp, a, b, _ in decomp}
    cmap = {(decomp[i][1], decomp[i][2]): decomp[i][0] for i in comp}

    def nfd(cp, out):
        if S_BASE <= cp < S_BASE + S_COUNT:
            s = cp - S_BASE
            out += [0x1100 + s // 588, 0x1161 + (s % 588) // 28] + ([0x11A7 + s % 28] if s % 28 else [])
        elif cp in dmap:
            a, b = dmap[cp]
            nfd(a, out)
            if b:
                nfd(b, out)
        else:
            out.append(cp)

    def nfc(s):
        d = []
        for ch in s:
            nfd(ord(ch), d)
        for i in range(1, len(d)):  # canonical order (stable insertion sort by ccc within runs)
            j = i
            while j > 0 and ccc_of.get(d[j], 0) and ccc_of.get(d[j - 1], 0) > ccc_of.get(d[j], 0):
                d[j - 1], d[j] = d[j], d[j - 1]
                j -= 1
        out, starter = [], -1
        for cp in d:
            c = ccc_of.get(cp, 0)
            last = ccc_of.get(out[-1], 0) if out else 0
            adjacent = starter == len(out) - 1
            if starter >= 0 and (adjacent or (last != 0 and last < c)):  # not blocked from the starter
                a = out[starter]
                if adjacent and 0x1100 <= a < 0x1113 and V_FIRST <= cp <= V_LAST:
                    out[starter] = S_BASE + ((a - 0x1100) * 21 + cp - V_FIRST) * 28
                    continue
                if adjacent and S_BASE <= a < S_BASE + S_COUNT and (a - S_BASE) % 28 == 0 and T_FIRST <= cp <= T_LAST:
                    out[starter] = a + cp - 0x11A7
                    continue
                if (a, cp) in cmap:
                    out[starter] = cmap[(a, cp)]
                    continue
            if c == 0:
                starter = len(out)
            out.append(cp)
        return "".join(map(chr, out))

    bad = 0
    for cp in range(0x110000):
        if 0xD800 <= cp <= 0xDFFF:
            continue
        for s in (chr(cp), "a" + chr(cp) + "\u0301\u0316", chr(cp) + "\u0308"):
            if nfc(s) != unicodedata.normalize("NFC", s):
                bad += 1
                if bad < 10:
                    print(f"mismatch at U+{cp:04X}: {s!r}", file=sys.stderr)
    return bad


def emit(path, ccc, decomp, comp, maybe, blocks):
    nblk = 0x110000 >> 8
    bits = bytearray((nblk + 7) // 8)
    for b in blocks:
        bits[b >> 3] |= 1 << (b & 7)

    def rows(vals, per, fmt):
        out = []
        for i in range(0, len(vals), per):
            out.append("    " + " ".join(fmt(v) + "," for v in vals[i:i + per]))
        return "\n".join(out)

    max_decomp = max(len(unicodedata.normalize("NFD", chr(cp))) for cp in range(0x110000) if not 0xD800 <= cp <= 0xDFFF)
    dvals = [(1 << 63 if e else 0) | cp << 42 | a << 21 | b for cp, a, b, e in decomp]
    with open(path, "w", encoding="ascii") as f:
        f.write(f"""/* tok/nfc_table: Unicode {unicodedata.unidata_version} data for NFC (tok/nfc.c). GENERATED by
 * tools/gen_nfc_table.py from Python {sys.version.split()[0]}'s unicodedata; do not edit. The layout of each
 * table is described in the script. */
#ifndef DSP_TOK_NFC_TABLE_H
#define DSP_TOK_NFC_TABLE_H

#include <stdint.h>

#define DSP_NFC_UNICODE_VERSION "{unicodedata.unidata_version}"
#define DSP_NFC_MAX_DECOMP {max_decomp} /* code points in the longest full canonical decomposition */

/* cp << 8 | canonical combining class, for every class != 0; sorted */
static const uint32_t nfc_ccc[{len(ccc)}] = {{
{rows([cp << 8 | c for cp, c in ccc], 8, lambda v: f"0x{v:07X}")}
}};

/* bit 63: excluded from NFC; 42..62: code point; 21..41, 0..20: its one-level canonical mapping */
static const uint64_t nfc_decomp[{len(decomp)}] = {{
{rows(dvals, 4, lambda v: f"0x{v:016X}u")}
}};

/* indices into nfc_decomp of the composing pairs, sorted by (first, second) */
static const uint16_t nfc_comp[{len(comp)}] = {{
{rows(comp, 12, str)}
}};

/* NFC_Quick_Check = Maybe; sorted */
static const uint32_t nfc_maybe[{len(maybe)}] = {{
{rows(maybe, 8, lambda v: f"0x{v:05X}")}
}};

/* bit b: code points b*256 .. b*256+255 include one of the above */
static const uint8_t nfc_block[{len(bits)}] = {{
{rows(list(bits), 16, lambda v: f"0x{v:02X}")}
}};

#endif
""")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(ROOT, "src", "tok", "nfc_table.h"))
    ap.add_argument("--no-check", action="store_true", help="skip the cross-check against unicodedata.normalize")
    a = ap.parse_args()
    ccc, decomp, comp, maybe, blocks = build()
    if not a.no_check:
        bad = check(ccc, decomp, comp, maybe)
        if bad:
            print(f"{bad} mismatches against unicodedata.normalize: not writing", file=sys.stderr)
            return 1
    emit(a.out, ccc, decomp, comp, maybe, blocks)
    print(f"{a.out}: Unicode {unicodedata.unidata_version}: {len(ccc)} classes, {len(decomp)} decompositions, "
          f"{len(comp)} compositions, {len(maybe)} maybe, {len(blocks)} blocks", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

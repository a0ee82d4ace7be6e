"""SHA-256 (FIPS 180-4) in plain Python, for the few short inputs one CLI call hashes without loading OpenSSL.

`hashlib` loads OpenSSL's libcrypto on import: about 3 ms, a sixth of a bare `python -c pass`, paid by every
`signal` (its id, contract §7), every call presenting a run token (its `sha256:` hash, contract §5) and a
hook's full path. Hashing a signal id or a token here costs about 0.1 ms per 64 bytes, so a CLI call is
faster this way; a long-lived process (the MCP server) or a long input is faster through hashlib.
names.sha256_hex chooses; tests/test_names.py holds this to hashlib on every length around the block edges.
"""

from __future__ import annotations

_K = (
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
)
_INITIAL = (0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19)
_MASK = 0xFFFFFFFF


def hexdigest(data: bytes) -> str:
    """The SHA-256 of `data` as 64 lowercase hex digits, as hashlib.sha256(data).hexdigest() gives it."""
    size = len(data)
    # padding: a 1 bit, zeros up to 56 bytes into the last block, the length in bits as 8 bytes
    message = bytes(data) + b"\x80" + b"\x00" * ((55 - size) % 64) + (size * 8).to_bytes(8, "big")
    state = list(_INITIAL)
    mask, constants = _MASK, _K
    for start in range(0, len(message), 64):
        w = [int.from_bytes(message[i:i + 4], "big") for i in range(start, start + 64, 4)]
        for i in range(16, 64):
            x, y = w[i - 15], w[i - 2]
            s0 = ((x >> 7 | x << 25) ^ (x >> 18 | x << 14) ^ (x >> 3)) & mask
            s1 = ((y >> 17 | y << 15) ^ (y >> 19 | y << 13) ^ (y >> 10)) & mask
            w.append((w[i - 16] + s0 + w[i - 7] + s1) & mask)
        a, b, c, d, e, f, g, h = state
        for i in range(64):
            sum1 = ((e >> 6 | e << 26) ^ (e >> 11 | e << 21) ^ (e >> 25 | e << 7)) & mask
            t1 = h + sum1 + ((e & f) ^ (~e & g)) + constants[i] + w[i]
            sum0 = ((a >> 2 | a << 30) ^ (a >> 13 | a << 19) ^ (a >> 22 | a << 10)) & mask
            t2 = sum0 + ((a & b) ^ (a & c) ^ (b & c))
            h, g, f, e, d, c, b, a = g, f, e, (d + t1) & mask, c, b, a, (t1 + t2) & mask
        state = [(old + new) & mask for old, new in zip(state, (a, b, c, d, e, f, g, h))]
    return "".join(f"{word:08x}" for word in state)

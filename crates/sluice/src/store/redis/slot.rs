//! Redis Cluster's key → slot rule, so a request's checks can be grouped by slot before they are
//! sent (one script call per slot: a script may only touch keys of one slot).
//!
//! The rule (cluster spec): if the key has a `{` followed later by a `}` with at least one byte
//! between them, only those bytes (the first such tag) are hashed; otherwise the whole key is.
//! The hash is CRC16/XMODEM, modulo 16384.

/// How many slots a cluster has.
pub(crate) const SLOTS: u16 = 16_384;

/// The bytes Redis hashes for `key`.
pub(crate) fn hash_tag(key: &[u8]) -> &[u8] {
    if let Some(open) = key.iter().position(|&b| b == b'{')
        && let Some(len) = key[open + 1..].iter().position(|&b| b == b'}')
        && len > 0
    {
        return &key[open + 1..open + 1 + len];
    }
    key
}

/// The slot of `key`: what decides which master of a cluster holds it. Tests use it to pick
/// keys that land on the same master, or on different ones.
pub fn slot(key: &[u8]) -> u16 {
    crc16(hash_tag(key)) % SLOTS
}

/// CRC16/XMODEM (polynomial 0x1021, initial value 0), bit by bit: keys are short, and this runs
/// once per check.
fn crc16(bytes: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &byte in bytes {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_redis() {
        // Values from `CLUSTER KEYSLOT` and the cluster spec.
        assert_eq!(crc16(b"123456789"), 0x31C3);
        assert_eq!(slot(b"foo"), 12182);
        assert_eq!(slot(b"bar"), 5061);
        assert_eq!(slot(b"{user1000}.following"), slot(b"{user1000}.followers"));
        assert_eq!(slot(b"{user1000}.following"), slot(b"user1000"));
    }

    #[test]
    fn hash_tag_rule() {
        assert_eq!(hash_tag(b"{a}b"), b"a");
        assert_eq!(hash_tag(b"x{a}{b}"), b"a");
        assert_eq!(
            hash_tag(b"foo{}{bar}"),
            b"foo{}{bar}",
            "empty first tag: whole key"
        );
        assert_eq!(hash_tag(b"foo{{bar}}zap"), b"{bar");
        assert_eq!(hash_tag(b"no tag"), b"no tag");
        assert_eq!(hash_tag(b"open{only"), b"open{only");
    }
}

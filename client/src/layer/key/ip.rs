//! The key of an IP address: the network of the prefix length it is limited by, so that one
//! budget covers what one party holds. An IPv6 host is usually given a whole /64 (SLAAC, most
//! ISPs' smallest assignment) and can pick a new address in it for every request; keyed on the
//! full address it would get 2^64 budgets. IPv4 addresses are scarce and keyed whole unless
//! asked otherwise (a shorter IPv4 prefix groups neighbours, e.g. one /24 of a cloud range,
//! at the price of limiting every host in it together).
//!
//! An IPv4-mapped IPv6 address (`::ffff:192.0.2.1`, what a dual-stack socket reports for an
//! IPv4 peer) is the IPv4 address it carries, so it has the same budget however it arrived.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// The prefix lengths addresses are keyed by: /32 (the whole address) for IPv4, /64 for IPv6,
/// unless set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Prefixes {
    v4: u8,
    v6: u8,
}

impl Default for Prefixes {
    fn default() -> Self {
        Prefixes { v4: 32, v6: 64 }
    }
}

impl Prefixes {
    /// IPv4 addresses keyed by their first `len` bits; above 32 counts as 32.
    pub(super) fn with_v4(self, len: u8) -> Self {
        Prefixes {
            v4: len.min(32),
            ..self
        }
    }

    /// IPv6 addresses keyed by their first `len` bits; above 128 counts as 128.
    pub(super) fn with_v6(self, len: u8) -> Self {
        Prefixes {
            v6: len.min(128),
            ..self
        }
    }

    /// The key of `ip`: the address itself when its prefix is its whole length, else its
    /// network as `network/len` (`2001:db8:1:2::/64`), in the canonical text form, so one
    /// network always has one key.
    pub(super) fn key(self, ip: IpAddr) -> String {
        match ip {
            IpAddr::V4(v4) => self.key_v4(v4),
            IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                Some(v4) => self.key_v4(v4),
                None => self.key_v6(v6),
            },
        }
    }

    fn key_v4(self, ip: Ipv4Addr) -> String {
        if self.v4 == 32 {
            return ip.to_string();
        }
        // `checked_shl` is `None` for a shift by the whole width: a /0 mask is all zeros.
        let mask = u32::MAX.checked_shl(32 - u32::from(self.v4)).unwrap_or(0);
        let network = Ipv4Addr::from(u32::from(ip) & mask);
        format!("{network}/{}", self.v4)
    }

    fn key_v6(self, ip: Ipv6Addr) -> String {
        if self.v6 == 128 {
            return ip.to_string();
        }
        let mask = u128::MAX.checked_shl(128 - u32::from(self.v6)).unwrap_or(0);
        let network = Ipv6Addr::from(u128::from(ip) & mask);
        format!("{network}/{}", self.v6)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(prefixes: Prefixes, ip: &str) -> String {
        prefixes.key(ip.parse().unwrap())
    }

    #[test]
    fn ipv6_is_keyed_by_its_64_and_ipv4_whole_by_default() {
        let default = Prefixes::default();
        assert_eq!(key(default, "2001:db8:1:2:3:4:5:6"), "2001:db8:1:2::/64");
        assert_eq!(key(default, "2001:db8:1:2:ffff::1"), "2001:db8:1:2::/64");
        assert_eq!(key(default, "2001:db8:1:3::1"), "2001:db8:1:3::/64");
        assert_eq!(key(default, "::1"), "::/64");
        assert_eq!(key(default, "203.0.113.7"), "203.0.113.7");
    }

    #[test]
    fn prefixes_are_configurable_and_capped_at_the_address_length() {
        let p56 = Prefixes::default().with_v6(56);
        assert_eq!(key(p56, "2001:db8:1:2ff::1"), "2001:db8:1:200::/56");
        let whole = Prefixes::default().with_v6(200);
        assert_eq!(key(whole, "2001:db8::1"), "2001:db8::1");
        let none = Prefixes::default().with_v6(0);
        assert_eq!(key(none, "2001:db8::1"), "::/0");
        let p24 = Prefixes::default().with_v4(24);
        assert_eq!(key(p24, "203.0.113.7"), "203.0.113.0/24");
        assert_eq!(
            key(Prefixes::default().with_v4(0), "203.0.113.7"),
            "0.0.0.0/0"
        );
        assert_eq!(
            key(Prefixes::default().with_v4(99), "203.0.113.7"),
            "203.0.113.7"
        );
    }

    #[test]
    fn a_mapped_address_is_its_ipv4_address() {
        let default = Prefixes::default();
        assert_eq!(key(default, "::ffff:203.0.113.7"), "203.0.113.7");
        let p24 = default.with_v4(24);
        assert_eq!(key(p24, "::ffff:203.0.113.7"), "203.0.113.0/24");
    }
}

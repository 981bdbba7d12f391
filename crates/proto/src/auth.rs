//! Handshake authentication: HMAC-SHA256 over the server's challenge, keyed
//! with the volume secret.

use hmac::{Hmac, Mac};
use sha2::Sha256;

/// Length of the server's nonce.
pub const NONCE_LEN: usize = 32;

const CONTEXT: &[u8] = b"solofs-auth-v1";

/// HMAC-SHA256 keyed with `secret`.
#[allow(clippy::expect_used, reason = "HMAC takes keys of any length")]
fn hmac(secret: &[u8]) -> Hmac<Sha256> {
    <Hmac<Sha256> as Mac>::new_from_slice(secret).expect("HMAC takes keys of any length")
}

/// The MAC a client sends: HMAC-SHA256(secret, "solofs-auth-v1" ‖ nonce ‖ volume id).
pub fn auth_mac(secret: &[u8], nonce: &[u8], volume: &[u8]) -> [u8; 32] {
    let mut m = hmac(secret);
    m.update(CONTEXT);
    m.update(nonce);
    m.update(volume);
    m.finalize().into_bytes().into()
}

/// How a client key file starts: `solofs-key NAME SECRET` (written by
/// `solofs key add`; the volume secret file holds the secret alone).
pub const KEY_PREFIX: &str = "solofs-key ";

/// Longest key name.
pub const KEY_NAME_MAX: usize = 64;

/// A valid key name: 1 to 64 of `A-Z a-z 0-9 . _ -`.
pub fn key_name_ok(name: &str) -> bool {
    (1..=KEY_NAME_MAX).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
}

/// The key name and secret of what a client was given to authenticate
/// with: a key file's text (`solofs-key NAME SECRET`) names its key; any
/// other text is the volume secret itself.
pub fn split_key(secret: &[u8]) -> (Option<&[u8]>, &[u8]) {
    let Some(rest) = secret.strip_prefix(KEY_PREFIX.as_bytes()) else {
        return (None, secret);
    };
    let rest = rest.trim_ascii();
    match rest.iter().position(|b| b.is_ascii_whitespace()) {
        Some(i) => (Some(&rest[..i]), rest[i..].trim_ascii()),
        None => (None, secret),
    }
}

/// Constant-time check of a client's MAC.
pub fn verify_mac(secret: &[u8], nonce: &[u8], volume: &[u8], mac: &[u8]) -> bool {
    let mut m = hmac(secret);
    m.update(CONTEXT);
    m.update(nonce);
    m.update(volume);
    m.verify_slice(mac).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc4231_case_2() {
        // HMAC-SHA256 test vector (RFC 4231, test case 2), through the crate.
        let mut m = <Hmac<Sha256> as Mac>::new_from_slice(b"Jefe").unwrap();
        m.update(b"what do ya want for nothing?");
        let out: [u8; 32] = m.finalize().into_bytes().into();
        assert_eq!(out[..8], [0x5b, 0xdc, 0xc1, 0x46, 0xbf, 0x60, 0x75, 0x4e]);
    }

    #[test]
    fn key_files_name_their_key() {
        assert_eq!(split_key(b"abc"), (None, &b"abc"[..]));
        assert_eq!(
            split_key(b"solofs-key ci-7 00ff\n"),
            (Some(&b"ci-7"[..]), &b"00ff"[..])
        );
        assert!(key_name_ok("ci-7.build_x"));
        assert!(!key_name_ok("a b") && !key_name_ok("") && !key_name_ok("a/b"));
        assert!(!key_name_ok(&"x".repeat(65)));
    }

    #[test]
    fn mac_binds_secret_nonce_and_volume() {
        let m = auth_mac(b"s3cret", &[1; 32], &[2; 16]);
        assert!(verify_mac(b"s3cret", &[1; 32], &[2; 16], &m));
        assert!(!verify_mac(b"other", &[1; 32], &[2; 16], &m));
        assert!(!verify_mac(b"s3cret", &[3; 32], &[2; 16], &m));
        assert!(!verify_mac(b"s3cret", &[1; 32], &[4; 16], &m));
        assert!(!verify_mac(b"s3cret", &[1; 32], &[2; 16], &m[..31]));
    }
}

//! Handshake authentication: HMAC-SHA256 over the server's challenge, keyed
//! with the volume secret.

use hmac::{Hmac, Mac};
use sha2::Sha256;

/// Length of the server's nonce.
pub const NONCE_LEN: usize = 32;

const CONTEXT: &[u8] = b"solofs-auth-v1";

/// The MAC a client sends: HMAC-SHA256(secret, "solofs-auth-v1" ‖ nonce ‖ volume id).
pub fn auth_mac(secret: &[u8], nonce: &[u8], volume: &[u8]) -> [u8; 32] {
    let mut m =
        <Hmac<Sha256> as Mac>::new_from_slice(secret).expect("HMAC takes keys of any length");
    m.update(CONTEXT);
    m.update(nonce);
    m.update(volume);
    m.finalize().into_bytes().into()
}

/// Constant-time check of a client's MAC.
pub fn verify_mac(secret: &[u8], nonce: &[u8], volume: &[u8], mac: &[u8]) -> bool {
    let mut m =
        <Hmac<Sha256> as Mac>::new_from_slice(secret).expect("HMAC takes keys of any length");
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
    fn mac_binds_secret_nonce_and_volume() {
        let m = auth_mac(b"s3cret", &[1; 32], &[2; 16]);
        assert!(verify_mac(b"s3cret", &[1; 32], &[2; 16], &m));
        assert!(!verify_mac(b"other", &[1; 32], &[2; 16], &m));
        assert!(!verify_mac(b"s3cret", &[3; 32], &[2; 16], &m));
        assert!(!verify_mac(b"s3cret", &[1; 32], &[4; 16], &m));
        assert!(!verify_mac(b"s3cret", &[1; 32], &[2; 16], &m[..31]));
    }
}

//! A gRPC call written frame by frame: the connection preface, SETTINGS, one HEADERS frame with
//! literal (unindexed, not Huffman-coded) fields and one DATA frame with the message. HTTP/2
//! client libraries check the `:authority` they send; this one sends any, so tests can send
//! what Envoy sends under Istio (`outbound|8081||name`). It also runs over any socket (Unix
//! sockets included). `tests/it/connection_age.rs` builds on the same frame codec.

use std::io::{Read, Write};

use prost::Message;
use sluice::proto::{RateLimitRequest, RateLimitResponse};

pub const DATA: u8 = 0x0;
pub const HEADERS: u8 = 0x1;
pub const RST_STREAM: u8 = 0x3;
pub const SETTINGS: u8 = 0x4;
pub const GOAWAY: u8 = 0x7;
pub const CONTINUATION: u8 = 0x9;
pub const END_STREAM: u8 = 0x1;
pub const END_HEADERS: u8 = 0x4;
pub const ACK: u8 = 0x1;
/// The GOAWAY error code of a peer sent away for abuse.
pub const ENHANCE_YOUR_CALM: u32 = 0xb;

pub fn encode_frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = u32::try_from(payload.len()).unwrap();
    let mut out = len.to_be_bytes()[1..].to_vec();
    out.extend([kind, flags]);
    out.extend(stream.to_be_bytes());
    out.extend(payload);
    out
}

/// An HPACK integer with a 7-bit prefix (RFC 7541 §5.1), the Huffman bit clear.
fn hpack_length(out: &mut Vec<u8>, mut n: usize) {
    if n < 127 {
        out.push(n as u8);
        return;
    }
    out.push(127);
    n -= 127;
    while n >= 128 {
        out.push((n % 128) as u8 | 0x80);
        n /= 128;
    }
    out.push(n as u8);
}

/// "Literal header field without indexing, new name" for each field (RFC 7541 §6.2.2).
pub fn header_block(fields: &[(&str, &str)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (name, value) in fields {
        out.push(0x00);
        hpack_length(&mut out, name.len());
        out.extend(name.as_bytes());
        hpack_length(&mut out, value.len());
        out.extend(value.as_bytes());
    }
    out
}

/// The header block of a `ShouldRateLimit` call to `authority`.
pub fn should_rate_limit_headers(authority: &str) -> Vec<u8> {
    header_block(&[
        (":method", "POST"),
        (":scheme", "http"),
        (
            ":path",
            "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit",
        ),
        (":authority", authority),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
    ])
}

fn read_frame(stream: &mut impl Read) -> (u8, u8, u32, Vec<u8>) {
    let mut head = [0u8; 9];
    stream.read_exact(&mut head).unwrap();
    let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
    let id = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
    let mut payload = vec![0u8; len];
    stream.read_exact(&mut payload).unwrap();
    (head[3], head[4], id, payload)
}

/// Sends one ShouldRateLimit call with `authority` over raw HTTP/2 on `stream` (a connected
/// socket with a read timeout) and returns the decoded response, or why there is none.
pub fn should_rate_limit(
    mut stream: impl Read + Write,
    authority: &str,
    request: &RateLimitRequest,
) -> Result<RateLimitResponse, String> {
    let mut out = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    out.extend(encode_frame(SETTINGS, 0, 0, &[]));
    let headers = should_rate_limit_headers(authority);
    out.extend(encode_frame(HEADERS, END_HEADERS, 1, &headers));
    let message = request.encode_to_vec();
    let mut body = vec![0u8];
    body.extend(u32::try_from(message.len()).unwrap().to_be_bytes());
    body.extend(message);
    out.extend(encode_frame(DATA, END_STREAM, 1, &body));
    stream.write_all(&out).unwrap();

    let mut data = Vec::new();
    loop {
        let (kind, flags, id, payload) = read_frame(&mut stream);
        match kind {
            SETTINGS if flags & ACK == 0 => stream
                .write_all(&encode_frame(SETTINGS, ACK, 0, &[]))
                .unwrap(),
            RST_STREAM if id == 1 => return Err(format!("stream reset: {payload:?}")),
            GOAWAY => return Err(format!("connection closed: {payload:?}")),
            DATA if id == 1 => {
                data.extend(&payload);
                if flags & END_STREAM != 0 {
                    break;
                }
            }
            // The trailers end the call.
            HEADERS if id == 1 && flags & END_STREAM != 0 => break,
            _ => {}
        }
    }
    if data.len() < 5 {
        return Err(format!(
            "no gRPC message in the answer ({} bytes)",
            data.len()
        ));
    }
    RateLimitResponse::decode(&data[5..]).map_err(|e| e.to_string())
}

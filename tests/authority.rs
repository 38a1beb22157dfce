//! A gRPC call whose `:authority` is not a valid URI authority is answered, as grpc-go (the
//! reference service's server) answers it. Envoy sends the cluster name there; under Istio that
//! is `outbound|8081||name`, which h2 used to reset with PROTOCOL_ERROR (Envoy then failed open
//! on every call).
//!
//! No HTTP/2 client library can send such a request (they all parse the authority first), so
//! this test writes the frames itself: the connection preface, SETTINGS, one HEADERS frame with
//! literal (unindexed, not Huffman-coded) fields, and one DATA frame with the gRPC message.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use common::*;
use prost::Message;
use sluice::proto::{Code, RateLimitResponse};

const ISTIO_AUTHORITY: &str = "outbound|8081||sluice.default.svc.cluster.local";

const DATA: u8 = 0x0;
const HEADERS: u8 = 0x1;
const RST_STREAM: u8 = 0x3;
const SETTINGS: u8 = 0x4;
const GOAWAY: u8 = 0x7;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const ACK: u8 = 0x1;

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
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
fn header_block(fields: &[(&str, &str)]) -> Vec<u8> {
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

fn read_frame(stream: &mut TcpStream) -> (u8, u8, u32, Vec<u8>) {
    let mut head = [0u8; 9];
    stream.read_exact(&mut head).unwrap();
    let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
    let id = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
    let mut payload = vec![0u8; len];
    stream.read_exact(&mut payload).unwrap();
    (head[3], head[4], id, payload)
}

/// Sends one ShouldRateLimit call with `authority` over raw HTTP/2 and returns the decoded
/// response, or the reason the server gave none.
fn call_with_authority(
    addr: std::net::SocketAddr,
    authority: &str,
) -> Result<RateLimitResponse, String> {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut out = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    out.extend(frame(SETTINGS, 0, 0, &[]));
    let headers = header_block(&[
        (":method", "POST"),
        (":scheme", "http"),
        (
            ":path",
            "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit",
        ),
        (":authority", authority),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
    ]);
    out.extend(frame(HEADERS, END_HEADERS, 1, &headers));
    let message = request("d", vec![descriptor(&[("k", "v")])]).encode_to_vec();
    let mut body = vec![0u8];
    body.extend(u32::try_from(message.len()).unwrap().to_be_bytes());
    body.extend(message);
    out.extend(frame(DATA, END_STREAM, 1, &body));
    stream.write_all(&out).unwrap();

    let mut data = Vec::new();
    loop {
        let (kind, flags, id, payload) = read_frame(&mut stream);
        match kind {
            SETTINGS if flags & ACK == 0 => stream.write_all(&frame(SETTINGS, ACK, 0, &[])).unwrap(),
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
        return Err(format!("no gRPC message in the answer ({} bytes)", data.len()));
    }
    RateLimitResponse::decode(&data[5..]).map_err(|e| e.to_string())
}

#[test]
fn a_call_with_istios_cluster_name_as_authority_is_answered() {
    let dir = config_dir(
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 1}\n",
    );
    let sluice = Sluice::start(dir.path(), None, &[]);
    let first = call_with_authority(sluice.grpc, ISTIO_AUTHORITY).unwrap();
    assert_eq!(first.overall_code, Code::Ok as i32);
    // The call was decided, not just answered: the second one is over the limit.
    let second = call_with_authority(sluice.grpc, ISTIO_AUTHORITY).unwrap();
    assert_eq!(second.overall_code, Code::OverLimit as i32);
    // An ordinary authority still works on the same path.
    let third = call_with_authority(sluice.grpc, "sluice:8081").unwrap();
    assert_eq!(third.overall_code, Code::OverLimit as i32);
}

//! The codec of the generated gRPC servers: prost's encoding, with a request that does not
//! decode answered `INVALID_ARGUMENT`.
//!
//! tonic's prost codec answers a message that does not decode (bytes that are not protobuf, a
//! truncated message, a `string` field that is not UTF-8, such as a native-API `name` or
//! `client_id`) with `INTERNAL`. gRPC clients take `INTERNAL` for a server bug and may retry it;
//! a request that does not decode is the caller's error and will never decode, which is what
//! `INVALID_ARGUMENT` says. The answer names the message, the field and the reason, as prost
//! reports them (`TryAcquireRequest.name: invalid string value: data is not UTF-8 encoded`).
//!
//! Only the servers use this codec (`build.rs`); the generated clients keep prost's, since a
//! response that does not decode is the server's fault.

use std::marker::PhantomData;

use prost::Message;
use tonic::Status;
use tonic::codec::{Codec, DecodeBuf, Decoder};
use tonic_prost::ProstEncoder;

/// A server's codec: encodes responses `T` as prost does, decodes requests `U`.
#[derive(Debug, Clone)]
pub struct ServerCodec<T, U>(PhantomData<(T, U)>);

impl<T, U> Default for ServerCodec<T, U> {
    fn default() -> Self {
        Self(PhantomData)
    }
}

impl<T, U> Codec for ServerCodec<T, U>
where
    T: Message + Send + 'static,
    U: Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ProstEncoder<T>;
    type Decoder = RequestDecoder<U>;

    fn encoder(&mut self) -> ProstEncoder<T> {
        ProstEncoder::default()
    }

    fn decoder(&mut self) -> RequestDecoder<U> {
        RequestDecoder(PhantomData)
    }
}

/// Decodes one request message; one that does not decode is `INVALID_ARGUMENT`.
#[derive(Debug)]
pub struct RequestDecoder<U>(PhantomData<U>);

impl<U: Message + Default> Decoder for RequestDecoder<U> {
    type Item = U;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<U>, Status> {
        decode_request(buf).map(Some)
    }
}

/// One request message from `buf`, which holds exactly its bytes.
fn decode_request<U: Message + Default>(buf: impl bytes::Buf) -> Result<U, Status> {
    U::decode(buf).map_err(|e| Status::invalid_argument(format!("invalid request: {e}")))
}

#[cfg(test)]
mod tests {
    use tonic::Code;

    use super::*;
    use crate::sluice::v1::TryAcquireRequest;

    fn decode(message: &[u8]) -> Result<TryAcquireRequest, Status> {
        decode_request(message)
    }

    #[test]
    fn a_request_that_does_not_decode_is_invalid_argument_naming_the_field() {
        // Field 1 (`name`), 2 bytes long, that are not UTF-8.
        let status = decode(&[0x0a, 0x02, 0xff, 0xfe]).unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument);
        assert_eq!(
            status.message(),
            "invalid request: failed to decode Protobuf message: \
             TryAcquireRequest.name: invalid string value: data is not UTF-8 encoded"
        );
        // A length running past the end of the message.
        let status = decode(&[0x0a, 0x7f, b'x']).unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    }

    #[test]
    fn a_request_that_decodes_is_the_message() {
        let sent = TryAcquireRequest {
            name: "api".into(),
            permits: 3,
            ..Default::default()
        };
        assert_eq!(decode(&sent.encode_to_vec()).unwrap(), sent);
    }
}

//! Compiles `proto/` into Rust with prost/tonic.
//!
//! The protobuf compiler is `protox`, a pure-Rust implementation, so a fresh machine builds
//! without a `protoc` binary and the build does not depend on whichever `protoc` happens to be
//! installed. The encoded descriptor set is also written to OUT_DIR: the server uses it for gRPC
//! reflection and for the proto3-JSON mapping of the HTTP `/json` endpoint.
//!
//! # Bytes, not strings, for what a client can put in a request
//!
//! `RateLimitRequest.domain` and `RateLimitDescriptor.Entry.key`/`value` are proto3 `string`s,
//! but Envoy copies HTTP/1 header bytes (obs-text, 0x80–0xFF) into them unchanged. A generated
//! `String` field makes prost refuse the whole message on invalid UTF-8, tonic answers
//! `INTERNAL`, and Envoy fails open: one byte would switch every limit off (issue #27). So the
//! Rust types are generated from a copy of the descriptors where those three fields are `bytes`
//! (the same wire format: length-delimited), and the service judges whatever bytes arrive. The
//! encoded set written to OUT_DIR keeps the original `string` types, so reflection and the JSON
//! mapping show the protocol as Envoy defines it.
//!
//! # A request that does not decode is the caller's error
//!
//! tonic's prost codec answers a message that does not decode with `INTERNAL`, which gRPC
//! clients take for a server bug and may retry. The generated servers use [`SERVER_CODEC`]
//! instead, which answers `INVALID_ARGUMENT` (`src/codec.rs`); the generated clients keep
//! prost's codec, where a response that does not decode is the server's fault and `INTERNAL` is
//! right. tonic's builder takes one codec for everything it generates, so each service goes
//! through two generators, one writing its client and one its server.

use std::path::PathBuf;

use prost_build::ServiceGenerator;
use prost_types::field_descriptor_proto::Type;
use prost_types::{DescriptorProto, FileDescriptorSet};

const PROTOS: &[&str] = &[
    "envoy/service/ratelimit/v3/rls.proto",
    "envoy/service/rate_limit_quota/v3/rlqs.proto",
    "envoy/service/discovery/v3/ads.proto",
    "ratelimit/config/ratelimit/v3/rls_conf.proto",
    "sluice/v1/limiter.proto",
    "sluice/v1/admin.proto",
];

/// The codec of the generated servers (the clients keep `tonic_prost::ProstCodec`).
const SERVER_CODEC: &str = "crate::codec::ServerCodec";

/// The client-controlled `string` fields decoded as bytes: (package, message path, field).
const AS_BYTES: &[(&str, &[&str], &str)] = &[
    (
        "envoy.service.ratelimit.v3",
        &["RateLimitRequest"],
        "domain",
    ),
    (
        "envoy.extensions.common.ratelimit.v3",
        &["RateLimitDescriptor", "Entry"],
        "key",
    ),
    (
        "envoy.extensions.common.ratelimit.v3",
        &["RateLimitDescriptor", "Entry"],
        "value",
    ),
    // RLQS bucket values come from request headers as the RLS descriptor values do; the keys
    // come from Envoy's configuration (and a protobuf map key cannot be `bytes`).
    (
        "envoy.service.rate_limit_quota.v3",
        &["BucketId", "BucketEntry"],
        "value",
    ),
];

/// Maps generated as `BTreeMap`: a bucket id's entries are read in key order (its descriptor).
const BTREE_MAPS: &[&str] = &[".envoy.service.rate_limit_quota.v3.BucketId.bucket"];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    let mut compiler = protox::Compiler::new(["proto"])?;
    compiler.include_imports(true).include_source_info(false);
    compiler.open_files(PROTOS)?;
    let mut descriptors = compiler.file_descriptor_set();

    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(
        out_dir.join("sluice_descriptor.bin"),
        compiler.encode_file_descriptor_set(),
    )?;

    for (package, path, field) in AS_BYTES {
        as_bytes(&mut descriptors, package, path, field)?;
    }
    // The clients' `connect(url)` needs tonic's transport: only with the `transport` feature.
    let transport = std::env::var_os("CARGO_FEATURE_TRANSPORT").is_some();
    let clients = tonic_prost_build::configure()
        .build_server(false)
        .build_client(true)
        .build_transport(transport)
        .service_generator();
    let servers = tonic_prost_build::configure()
        .build_server(true)
        .build_client(false)
        .codec_path(SERVER_CODEC)
        .service_generator();
    prost_build::Config::new()
        .btree_map(BTREE_MAPS)
        .service_generator(Box::new(ClientsAndServers { clients, servers }))
        .compile_fds(descriptors)?;
    Ok(())
}

/// Writes each service's client with one generator and its server with another.
struct ClientsAndServers {
    clients: Box<dyn ServiceGenerator>,
    servers: Box<dyn ServiceGenerator>,
}

impl ServiceGenerator for ClientsAndServers {
    fn generate(&mut self, service: prost_build::Service, buf: &mut String) {
        self.clients.generate(service.clone(), buf);
        self.servers.generate(service, buf);
    }

    fn finalize(&mut self, buf: &mut String) {
        self.clients.finalize(buf);
        self.servers.finalize(buf);
    }

    fn finalize_package(&mut self, package: &str, buf: &mut String) {
        self.clients.finalize_package(package, buf);
        self.servers.finalize_package(package, buf);
    }
}

/// Turns one `string` field into `bytes`; fails the build when the field is not found or not a
/// string, so a renamed field cannot silently bring the decode error back.
fn as_bytes(
    set: &mut FileDescriptorSet,
    package: &str,
    path: &[&str],
    field: &str,
) -> Result<(), String> {
    let missing = || format!("{package}.{}.{field} is not in proto/", path.join("."));
    let file = set
        .file
        .iter_mut()
        .find(|f| f.package() == package && f.message_type.iter().any(|m| m.name() == path[0]))
        .ok_or_else(missing)?;
    let message = find_message(&mut file.message_type, path).ok_or_else(missing)?;
    let field = message
        .field
        .iter_mut()
        .find(|f| f.name() == field)
        .ok_or_else(missing)?;
    if field.r#type() != Type::String {
        return Err(format!("{} is not a string field", field.name()));
    }
    field.set_type(Type::Bytes);
    Ok(())
}

/// The message at `path` (outer message first, then nested ones).
fn find_message<'a>(
    messages: &'a mut [DescriptorProto],
    path: &[&str],
) -> Option<&'a mut DescriptorProto> {
    let (first, rest) = path.split_first()?;
    let found = messages.iter_mut().find(|m| m.name() == *first)?;
    if rest.is_empty() {
        Some(found)
    } else {
        find_message(&mut found.nested_type, rest)
    }
}

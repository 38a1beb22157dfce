//! Sluice's protocol, generated from `proto/` (`build.rs`): Envoy's RLS v3 service and the
//! messages it uses, Envoy's Rate Limit Quota Service (RLQS, `envoy.service.rate_limit_quota.v3`), the xDS (ADS) messages and `RateLimitConfig` resources of the xDS config
//! source, and Sluice's native API (`sluice.v1.Limiter`).
//!
//! The module tree mirrors the protobuf packages so generated cross-references resolve; the
//! types most code needs have short aliases at the bottom. The generated servers decode requests
//! with the codec in `codec.rs`, which answers a request that does not decode
//! `INVALID_ARGUMENT`; the generated clients keep prost's. The RLS `domain` and descriptor
//! entries are `bytes` here (`build.rs` says why). With the `transport` feature the clients
//! also have `connect(url)`.

// The hand-written items say what they are for; the generated modules allow their missing
// docs below, since protobuf comments are all they could carry.
#![deny(missing_docs)]

pub mod codec;

#[allow(clippy::all, missing_docs)]
pub mod envoy {
    pub mod config {
        pub mod core {
            pub mod v3 {
                tonic::include_proto!("envoy.config.core.v3");
            }
        }
    }
    pub mod extensions {
        pub mod common {
            pub mod ratelimit {
                pub mod v3 {
                    tonic::include_proto!("envoy.extensions.common.ratelimit.v3");
                }
            }
        }
    }
    pub mod r#type {
        pub mod v3 {
            tonic::include_proto!("envoy.r#type.v3");
        }
    }
    pub mod service {
        pub mod discovery {
            pub mod v3 {
                tonic::include_proto!("envoy.service.discovery.v3");
            }
        }
        pub mod ratelimit {
            pub mod v3 {
                tonic::include_proto!("envoy.service.ratelimit.v3");
            }
        }
        pub mod rate_limit_quota {
            pub mod v3 {
                tonic::include_proto!("envoy.service.rate_limit_quota.v3");
            }
        }
    }
}

/// The resources of upstream's xDS config source (`proto/ratelimit/config/ratelimit/v3/`).
#[allow(clippy::all, missing_docs)]
pub mod ratelimit {
    pub mod config {
        pub mod ratelimit {
            pub mod v3 {
                tonic::include_proto!("ratelimit.config.ratelimit.v3");
            }
        }
    }
}

/// `google.rpc.Status`, carried by a NACK.
#[allow(clippy::all, missing_docs)]
pub mod google {
    pub mod rpc {
        tonic::include_proto!("google.rpc");
    }
}

/// Sluice's own API (`proto/sluice/v1/limiter.proto`).
#[allow(clippy::all, missing_docs)]
pub mod sluice {
    pub mod v1 {
        tonic::include_proto!("sluice.v1");
    }
}

/// Encoded `FileDescriptorSet` of everything in `proto/` (with imports), for reflection and JSON.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/sluice_descriptor.bin"));

pub use envoy::config::core::v3::HeaderValue;
pub use envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
pub use envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
    Entry as DescriptorEntry, RateLimitOverride,
};
pub use envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, RateLimit as CurrentLimit, rate_limit::Unit as ResponseUnit,
};
pub use envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
pub use envoy::service::ratelimit::v3::rate_limit_service_server::{
    RateLimitService, RateLimitServiceServer,
};
pub use envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
pub use envoy::r#type::v3::RateLimitUnit as OverrideUnit;

//! The generated protocol types and client stubs (`build.rs`, from the workspace's `proto/`).
//!
//! The module tree mirrors the protobuf packages so the generated cross-references resolve. Most
//! users never need it: [`crate::Client`] speaks in the crate's own types. It is public for the
//! rare field the typed API does not carry (`RateLimitRequest`'s descriptor overrides, say).

#![allow(clippy::all, missing_docs)]

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
        pub mod ratelimit {
            pub mod v3 {
                tonic::include_proto!("envoy.service.ratelimit.v3");
            }
        }
    }
}

/// Sluice's native API, `sluice.v1.Limiter` (`proto/sluice/v1/limiter.proto`).
pub mod sluice {
    pub mod v1 {
        tonic::include_proto!("sluice.v1");
    }
}

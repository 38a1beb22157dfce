//! A gRPC call whose `:authority` is not a valid URI authority is answered, as grpc-go (the
//! reference service's server) answers it. Envoy sends the cluster name there; under Istio that
//! is `outbound|8081||name`, which h2 used to reset with PROTOCOL_ERROR (Envoy then failed open
//! on every call). No HTTP/2 client library sends such a request, so the test writes the frames
//! itself (`kit::raw_h2`).

use sluice_test_kit as kit;

use std::net::TcpStream;
use std::time::Duration;

use kit::*;
use sluice::proto::{Code, RateLimitResponse};

const ISTIO_AUTHORITY: &str = "outbound|8081||sluice.default.svc.cluster.local";

fn call(sluice: &Sluice, authority: &str) -> Result<RateLimitResponse, String> {
    let stream = TcpStream::connect(sluice.grpc).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let request = request("d", vec![descriptor(&[("k", "v")])]);
    raw_h2::should_rate_limit(stream, authority, &request)
}

#[test]
fn a_call_with_istios_cluster_name_as_authority_is_answered() {
    let dir = config_dir(
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 1}\n",
    );
    let sluice = Sluice::start(dir.path(), None, &[]);
    let first = call(&sluice, ISTIO_AUTHORITY).unwrap();
    assert_eq!(first.overall_code, Code::Ok as i32);
    // The call was decided, not just answered: the second one is over the limit.
    let second = call(&sluice, ISTIO_AUTHORITY).unwrap();
    assert_eq!(second.overall_code, Code::OverLimit as i32);
    // An ordinary authority still works on the same path.
    let third = call(&sluice, "sluice:8081").unwrap();
    assert_eq!(third.overall_code, Code::OverLimit as i32);
}

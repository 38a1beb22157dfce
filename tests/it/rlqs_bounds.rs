//! The quota service's bounds as an operator sets them (`RLQS_MAX_STREAMS`,
//! `RLQS_MAX_BUCKETS_PER_STREAM`), on the real binary over gRPC: a stream past the cap is refused
//! `RESOURCE_EXHAUSTED` and served again once one closes; a report of more buckets than a
//! stream may hold is answered for the ones it holds, and both refusals are counted. The quota
//! decisions themselves are tested with real Envoys in `rlqs.rs`.

use sluice_test_kit as kit;

use std::collections::BTreeMap;
use std::time::Duration;

use kit::{Sluice, config_dir};
use sluice_proto::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_client::RateLimitQuotaServiceClient;
use sluice_proto::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;
use sluice_proto::envoy::service::rate_limit_quota::v3::{
    BucketId, RateLimitQuotaResponse, RateLimitQuotaUsageReports,
};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Streaming;

const LIMITS: &str = "\
domain: rlqs
descriptors:
  - key: tenant
    rate_limit: { unit: minute, requests_per_unit: 100 }
";

fn report(tenants: &[&str]) -> RateLimitQuotaUsageReports {
    let usage = |tenant: &&str| BucketQuotaUsage {
        bucket_id: Some(BucketId {
            bucket: BTreeMap::from([("tenant".to_string(), tenant.as_bytes().to_vec())]),
        }),
        time_elapsed: None,
        num_requests_allowed: 1,
        num_requests_denied: 0,
    };
    RateLimitQuotaUsageReports {
        domain: "rlqs".into(),
        bucket_quota_usages: tenants.iter().map(usage).collect(),
    }
}

/// An open quota stream: its sender of reports (dropping it ends the stream) and its answers.
struct QuotaStream {
    reports: mpsc::Sender<RateLimitQuotaUsageReports>,
    answers: Streaming<RateLimitQuotaResponse>,
}

/// Opens a stream and sends `tenants`' first report; the server's refusal as the error.
async fn open(sluice: &Sluice, tenants: &[&str]) -> Result<QuotaStream, tonic::Status> {
    let mut client = RateLimitQuotaServiceClient::connect(format!("http://{}", sluice.grpc))
        .await
        .unwrap();
    let (reports, rx) = mpsc::channel(4);
    reports.send(report(tenants)).await.unwrap();
    let answers = client
        .stream_rate_limit_quotas(ReceiverStream::new(rx))
        .await?
        .into_inner();
    Ok(QuotaStream { reports, answers })
}

/// The next answer's bucket ids' tenants, sorted.
async fn answered(stream: &mut QuotaStream) -> Vec<String> {
    let answer = tokio::time::timeout(Duration::from_secs(30), stream.answers.message())
        .await
        .expect("an answer within 30 s")
        .expect("the stream stays open")
        .expect("an answer, not the stream's end");
    let mut tenants: Vec<String> = answer
        .bucket_action
        .iter()
        .map(|action| {
            let id = action
                .bucket_id
                .as_ref()
                .expect("an action names its bucket");
            String::from_utf8(id.bucket["tenant"].clone()).unwrap()
        })
        .collect();
    tenants.sort();
    tenants
}

#[tokio::test]
async fn streams_and_buckets_past_their_bounds_are_refused_and_counted() {
    let dir = config_dir(LIMITS);
    let sluice = Sluice::start(
        dir.path(),
        None,
        &[
            ("RLQS_MAX_STREAMS", "1"),
            ("RLQS_MAX_BUCKETS_PER_STREAM", "2"),
        ],
    );

    let mut first = open(&sluice, &["a", "b", "c"]).await.unwrap();
    assert_eq!(
        answered(&mut first).await,
        ["a", "b"],
        "two buckets held, the third not answered"
    );
    assert_eq!(
        sluice.metric("sluice_rlqs_refused_total{what=\"buckets\"}"),
        1.0
    );

    // With the one stream open, a second is refused; the gRPC status is what Envoy sees.
    let refused = match open(&sluice, &["d"]).await {
        Ok(mut stream) => stream.answers.message().await.expect_err("refused"),
        Err(status) => status,
    };
    assert_eq!(
        refused.code(),
        tonic::Code::ResourceExhausted,
        "{refused:?}"
    );
    assert_eq!(
        sluice.metric("sluice_rlqs_refused_total{what=\"streams\"}"),
        1.0
    );

    // Once the first stream ends, its place is free again.
    drop(first.reports);
    while let Ok(Some(_)) = first.answers.message().await {}
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while sluice.metric("sluice_rlqs_streams") != 0.0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the ended stream is still counted"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut second = open(&sluice, &["d"])
        .await
        .expect("served once the first ended");
    assert_eq!(answered(&mut second).await, ["d"]);
}

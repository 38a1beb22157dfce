//! The admin API (issue #42) on a real 3-master Redis Cluster: the done-when, and every
//! algorithm read, reset and admitted again, each counter's keys on whichever master serves
//! their slot.

use sluice_test_kit as kit;

use kit::admin::{CONFIG, TOKEN};
use kit::*;

#[tokio::test]
async fn a_used_up_limit_is_read_and_reset_on_a_cluster() {
    let cluster = RedisCluster::start(3, 0);
    let dir = config_dir(CONFIG);
    let mut cmd = sluice_command(dir.path());
    cmd.env("BACKEND_TYPE", "redis")
        .env("REDIS_TYPE", "cluster")
        .env("REDIS_URL", cluster.url())
        .env("ADMIN_API_TOKEN", TOKEN);
    let sluice = Sluice::spawn(cmd);
    let mut client = sluice.client().await;
    // Several users, so their counters fall in different slots (and masters).
    for user in ["u1", "u2", "u3", "u4"] {
        kit::admin::done_when(&mut client, sluice.debug, user).await;
    }
    kit::admin::every_algorithm_reads_and_resets(&mut client, sluice.debug, "a1").await;
    kit::admin::every_algorithm_reads_and_resets(&mut client, sluice.debug, "a2").await;
    for value in ["r1", "r2"] {
        kit::admin::refunds_give_hits_back(&mut client, sluice.debug, value).await;
    }
}

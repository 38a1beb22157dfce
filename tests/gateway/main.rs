//! Run apart from `tests/it`: Envoy Gateway's scenario, on the binary and in the image. Envoy
//! Gateway gives Envoy's call to Sluice a fixed 20 ms timeout, and the image's tests run
//! containers; beside the other modules' tests (2 cores, one kept busy, as CI runs) Envoy timed
//! out calls Sluice had answered in time (15 of 162 in one run), so the scenario's "no call
//! timed out" could not hold there; beside the other image tests it still missed one call in 15.
//! So this binary runs its tests one at a time (scripts/test.sh passes `--test-threads=1`; by
//! hand, pass it too), and the two scenarios also hold a lock (`run_scenario`).

mod envoy_gateway;
mod image;

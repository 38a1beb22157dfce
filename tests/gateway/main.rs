//! Run apart from `tests/it`: Envoy Gateway's scenario, on the binary and in the image. Envoy
//! Gateway gives Envoy's call to Sluice a fixed 20 ms timeout, and the image's tests run
//! containers; beside the other modules' tests (2 cores, one kept busy, as CI runs) Envoy timed
//! out calls Sluice had answered in time (15 of 162 in one run), so the scenario's "no call
//! timed out" could not hold there. Here these tests share the machine only with each other, and
//! the two Envoy Gateway scenarios run one at a time (`run_scenario` holds a lock).

mod envoy_gateway;
mod image;

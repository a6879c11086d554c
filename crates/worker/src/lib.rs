//! kjob-worker: leases Job keys and runs syncJob against the API server

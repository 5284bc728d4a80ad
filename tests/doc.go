// Package tests holds the end-to-end suites: they prove that the whole
// system (upstream -> pebble event store -> event service -> transport ->
// collector -> sink) keeps the guarantees of docs/design when everything
// runs together. `make test` runs them under the race detector at the
// default sizes; `make soak` runs them longer and larger.
//
// # How delivery is checked
//
// Stack scenarios (built from the packages by newHarness) apply every
// dispatcher's stream to a checker sink that verifies it as a downstream
// would see it, against the upstream as oracle (the deterministic
// Generator's rows, the recorded DDLs): per epoch, rows strictly in
// (commit-ts, start-ts, key) order (exactly once, in order), each DDL after
// the rows of its commit-ts, nothing at or below a resolved-ts already
// confirmed, checkpoints strictly increasing and never above the upstream's
// or the schema store's frontier, and at every checkpoint the rows and DDLs
// applied since the previous one exactly the oracle's. The final checkpoint
// of every dispatcher must equal the upstream's final resolved-ts (no lost
// wakeup). A sampler records, throughout, the preparation queues, the scan
// channel, the inbox and the resolved-ts pending sets, which must stay
// bounded by the number of dispatchers and the configured capacities.
// Server scenarios run cmd/cdcserver/app/synthetic (cdcserver synthetic)
// and assert on its own verification summary.
//
// # Suites
//
//	TestSteadyState                   1k dispatchers, up to 4 txns per commit-ts, DDLs at row commit-ts
//	TestSaturation                    10k dispatchers, 1 scan worker, scan channel 1: notify p99/max relative
//	TestSaturationServer              the same through the server, 10k tables
//	TestTransportFaults               delays, refusals, failures, drops and sink errors (stack)
//	TestTransportFaultsServer         refusals, failures and drops (server)
//	TestMovesServer                   tables moving away and back every 20 ms, with refusals and drops (server)
//	TestChurn                         seeded removes, re-adds from past start-ts, resets while data flows
//	TestSchemaStalls                  schema frontier stalls; parked dispatchers catch up with no notify
//	TestCrashRestart                  child server on a durable sink, SIGKILLed at seeded points, restarted
//	TestModel                         seeded model of the whole scheduler, checked after every step
//	TestShutdownUnderLoad             Close with 10k dispatchers, congested transport, writes in flight
//	TestScale                         200k dispatchers: footprint, and 3 rounds of advances to all of them
//	TestBoundedMemoryUnderCongestion  heap outside pebble vs bytes written while every send is refused
//
// TestMain runs goleak: no goroutine may survive the package.
//
// # Environment
//
//	CDCFLOW_SCALE=N            multiply durations and (where the issue fixes no count) dispatcher
//	                           counts by N; the 10k-dispatcher scenarios stay at 10k and run longer
//	CDCFLOW_SOAK=1             soak sizes: CDCFLOW_SCALE defaults to 4
//	CDCFLOW_SEED=S             seed of the randomised stack and server scenarios (each has a default)
//	CDCFLOW_MODEL_SEED=S       run TestModel with seed S only (replay)
//	CDCFLOW_MODEL_SEEDS=N      run N model seeds (default 5) ...
//	CDCFLOW_MODEL_SEED_BASE=B  ... starting at seed B (default 1)
//	CDCFLOW_CRASH_SEED=S       seed of the SIGKILL delays of TestCrashRestart (default 1)
//
// # Replaying a failure
//
// Every randomised test logs its seed and, when it fails, the command that
// replays it, for example
//
//	CDCFLOW_MODEL_SEED=17 go test -race -run '^TestModel$' ./tests/
//	CDCFLOW_SEED=5 go test -race -run '^TestChurn$' ./tests/
//
// A seed fixes the sequence of steps, faults and kill points; the goroutine
// interleaving is the scheduler's, so a replay exercises the same scenario,
// not necessarily the same interleaving. `go test -v ./tests/ | grep
// SCENARIO` prints one table row per scenario: dispatchers, rows, faults
// injected, resets observed, result.
package tests

package storetest

import (
	"context"
	"testing"
	"time"

	"github.com/taskgate/workers"
)

// An Option adjusts how [Run] and [RunRuntime] check a store.
type Option func(*suite)

// Durable declares that the store keeps its records beyond the life of
// the process. [Run] then requires that it does not implement
// [workers.RecordClearer], and [RunRuntime] that Runtime.Reset leaves its
// records in place, so that a reset can never delete durable rows.
func Durable() Option { return func(su *suite) { su.durable = true } }

// Serial runs the cases one after another instead of in parallel. Use it
// when the stores the factory returns cannot be isolated from each other,
// for instance because each call truncates the same shared tables.
func Serial() Option { return func(su *suite) { su.serial = true } }

// Timeout bounds each case that runs goroutines (every [RunRuntime]
// case does): past it the case fails as hung, its context is cancelled,
// and it is given as long again to return before its goroutines are
// abandoned. Defaults to 30 seconds; zero or a negative d keeps the
// default.
func Timeout(d time.Duration) Option { return func(su *suite) { su.timeout = d } }

const defaultTimeout = 30 * time.Second

// Peer gives the Notifier cases a second handle on the store under test:
// open returns another store over the same records (a second connection
// pool on the same database, say), whose writes the first handle's
// listeners must hear. Without it, those cases write through the one
// handle.
func Peer(open func(t *testing.T, s workers.Store) workers.Store) Option {
	return func(su *suite) { su.peer = open }
}

// suite is a configured run of the cases.
type suite struct {
	durable bool
	serial  bool
	timeout time.Duration
	peer    func(t *testing.T, s workers.Store) workers.Store
}

// A testCase checks one behaviour of a fresh store.
type testCase struct {
	name     string
	contract string // one sentence, logged when the case fails
	run      func(su *suite, t *testing.T, s workers.Store)
}

// Run checks that the stores newStore returns meet the [workers.Store]
// contract. Each case runs as a parallel subtest of t (unless [Serial] is
// given) with a store of its own: newStore is called once per case, from
// that case's goroutine, with the subtest's t. It must return an empty
// store, register its teardown with t.Cleanup, and call t.Fatal if it
// cannot build one.
func Run(t *testing.T, newStore func(t *testing.T) workers.Store, opts ...Option) {
	t.Helper()
	newSuite(opts).run(t, cases, newStore)
}

// newSuite applies opts over the defaults.
func newSuite(opts []Option) *suite {
	su := &suite{}
	for _, opt := range opts {
		opt(su)
	}
	if su.timeout <= 0 {
		su.timeout = defaultTimeout
	}
	return su
}

// run runs each case of table as a subtest of t, in parallel unless the suite is
// serial, with a store of its own from newStore, and logs the case's
// contract if it fails. Both entry points run their tables through it.
func (su *suite) run(t *testing.T, table []testCase, newStore func(t *testing.T) workers.Store) {
	t.Helper()
	for _, c := range table {
		t.Run(c.name, func(t *testing.T) {
			if !su.serial {
				t.Parallel()
			}
			s := newStore(t)
			if s == nil {
				t.Fatal("storetest: newStore returned a nil Store")
			}
			defer func() {
				if t.Failed() {
					t.Logf("contract: %s", c.contract)
				}
			}()
			c.run(su, t, s)
		})
	}
}

// cases is the suite, grouped by the method whose contract each checks.
var cases = []testCase{
	{"Get/MissingIsNotFound",
		"GetTask of an id with no record returns ErrNotFound.",
		(*suite).getMissing},
	{"Get/UnstorableIDIsNotFound",
		"an id holding a NUL byte or invalid UTF-8, which no record holds, is no error of its own: GetTask, SetTask, TransitionTask and AddWatcher return ErrNotFound.",
		(*suite).getUnstorableID},

	{"RoundTrip/AllFields",
		"every field InsertTask is given comes back from GetTask, in every status: times to the microsecond, the result byte for byte.",
		(*suite).roundTripAllFields},
	{"RoundTrip/ResultByteForByte",
		"a Result comes back byte for byte from InsertTask, SetTask, TransitionTask and ReplaceTask, as CheckState promises: spacing, escapes, duplicate keys and integers beyond float64's kept.",
		(*suite).roundTripResultBytes},
	{"RoundTrip/ZeroValues",
		"a record with no queue, no watchers, no result and zero times comes back with all of them empty, and its times zero.",
		(*suite).roundTripZeroValues},

	{"Insert/IDsAreExact",
		"ids are compared byte for byte: ids that differ only in case, in trailing spaces or in accents are distinct records, each inserted without ErrConflict and read, written and listed as its own, and an id no record holds byte for byte is ErrNotFound.",
		(*suite).insertIDsExact},
	{"Insert/ExistingIsConflict",
		"InsertTask of an id that has a record returns ErrConflict and leaves the stored record as it was.",
		(*suite).insertExisting},
	{"Insert/ConcurrentExactlyOneWins",
		"of many goroutines inserting records of one id at once, exactly one succeeds, the others get ErrConflict, and the stored record is the winner's.",
		(*suite).insertRace},
	{"Insert/EmptyRunIDRefused",
		"InsertTask of a record with an empty RunID returns ErrInvalidRunID and stores nothing.",
		(*suite).insertEmptyRunID},
	{"Insert/InvalidRecordRefused",
		"InsertTask and ReplaceTask refuse the records CheckRecord refuses (a RunID, Queue or watcher holding a NUL byte or invalid UTF-8, a watcher longer than a user id, or a CreatedAt before the zero time or within its first microsecond, among them), with the same errors, and write nothing.",
		(*suite).insertInvalid},

	{"Set/WritesStateOnly",
		"SetTask writes every State field and keeps the stored RunID, Watchers, Queue and CreatedAt, whatever its argument holds.",
		(*suite).setStateOnly},
	{"State/InvalidRefused",
		"InsertTask, SetTask, TransitionTask (even with an empty from, which can write nothing) and ReplaceTask refuse a state CheckState refuses (an unknown status, a result that is not JSON) with its errors, and one with a time no store holds (year 300,000) or a time before the zero time or within its first microsecond (which a store would keep as undated) with ErrInvalidData, and write nothing.",
		(*suite).invalidStateRefused},
	{"Set/MissingIsNotFound",
		"SetTask of an id with no record returns ErrNotFound and creates nothing.",
		(*suite).setMissing},

	{"Replace/PublishesNewRun",
		"ReplaceTask naming the stored run id writes the whole record: the new run id, the new watcher list and every other field.",
		(*suite).replacePublishes},
	{"Replace/StaleRunIsConflict",
		"ReplaceTask whose prevRunID is not the stored run id returns ErrConflict and writes nothing.",
		(*suite).replaceStale},
	{"Replace/ConcurrentExactlyOneWins",
		"of many goroutines replacing the same run at once, exactly one succeeds, the others get ErrConflict, and the stored record is the winner's.",
		(*suite).replaceRace},
	{"Replace/EmptyRunIDRefused",
		"ReplaceTask of a record with an empty RunID returns ErrInvalidRunID and writes nothing.",
		(*suite).replaceEmptyRunID},
	{"Replace/MissingIsNotFound",
		"ReplaceTask of an id with no record returns ErrNotFound and creates nothing.",
		(*suite).replaceMissing},

	{"Transition/WritesNextState",
		"TransitionTask naming the stored run id and status reports true, writes next's State, and leaves the identity fields as stored.",
		(*suite).transitionWrites},
	{"Transition/WrongStatusRejected",
		"TransitionTask whose from list lacks the stored status reports false, with no error, and writes nothing.",
		(*suite).transitionWrongStatus},
	{"Transition/UnknownFromStatusMatchesNothing",
		`a status of from that is not a known one matches no record, not even one whose status it names among others ("completed,failed"): TransitionTask reports false, with no error, and writes nothing; beside it, the known statuses of from fence as ever.`,
		(*suite).transitionUnknownFrom},
	{"Transition/EmptyRunIDRefused",
		"TransitionTask with an empty run id returns ErrInvalidRunID and writes nothing: there is no wildcard run.",
		(*suite).transitionEmptyRunID},
	{"Transition/MissingIsNotFound",
		"TransitionTask of an id with no record returns ErrNotFound.",
		(*suite).transitionMissing},
	{"Transition/ConcurrentExactlyOneWins",
		"of many goroutines racing the same transition, exactly one reports true, and the stored state is the winner's.",
		(*suite).transitionRace},

	{"Fencing/StaleRunRejected",
		"TransitionTask naming a run other than the stored one reports false and writes nothing, even when the status matches.",
		(*suite).fencingStaleRun},
	{"Fencing/ReplacedRunRejected",
		"once ReplaceTask has published a new run, TransitionTask and AddWatcher naming the previous run no longer write.",
		(*suite).fencingReplacedRun},
	{"Fencing/UnstorableRunIDMatchesNothing",
		"a run id argument holding a NUL byte or invalid UTF-8, which no record holds, matches no record and is no error of its own: TransitionTask reports false, ReplaceTask and AddWatcher return ErrConflict, each ErrNotFound where there is no record, and nothing is written.",
		(*suite).fencingUnstorableRunID},
	{"Fencing/SupersededWriteNeverLands",
		"an old run's transition racing the ReplaceTask that supersedes it never lands on the new run's record.",
		(*suite).fencingSuperseded},

	{"Watchers/AppendAdds",
		"AddWatcher naming the stored run appends a new watcher, reports true, and keeps the watchers already listed.",
		(*suite).watchersAppend},
	{"Watchers/ExistingIsNoop",
		"AddWatcher of a watcher already listed reports false, with no error, and leaves the list as it was.",
		(*suite).watchersExisting},
	{"Watchers/DuplicatesStoredOnce",
		"Watchers are a set: a record given a watcher more than once, by InsertTask or ReplaceTask, lists it once, in GetTask and ListTasks alike.",
		(*suite).watchersDuplicates},
	{"Watchers/StaleRunIsConflict",
		"AddWatcher naming a run other than the stored one returns ErrConflict and writes nothing.",
		(*suite).watchersStale},
	{"Watchers/EmptyRunIDRefused",
		"AddWatcher with an empty run id returns ErrInvalidRunID and writes nothing.",
		(*suite).watchersEmptyRunID},
	{"Watchers/UnstorableRefused",
		"AddWatcher refuses a watcher that holds a NUL byte or invalid UTF-8, or is longer than a user id (MaxOwnerIDLen), with ErrInvalidData, as CheckWatcher does, before it reads the record (whatever run it names, and whether there is one), after its context's and run id's checks, and writes nothing.",
		(*suite).watchersUnstorable},
	{"Watchers/MissingIsNotFound",
		"AddWatcher to an id with no record returns ErrNotFound.",
		(*suite).watchersMissing},
	{"Watchers/AppendRacingReplaceNeverLands",
		"an AddWatcher under a run that races the ReplaceTask ending that run either lands before the replace (and is dropped by it) or fails; the new run's record never lists it.",
		(*suite).watchersRaceReplace},
	{"Watchers/ConcurrentAppendsSurvive",
		"concurrent appends of distinct watchers to one record all report true and are all listed afterwards, beside the original watchers.",
		(*suite).watchersRace},
	{"Watchers/ConcurrentDuplicateAddedOnce",
		"of many goroutines appending the same watcher at once, exactly one reports true, and the watcher is listed once.",
		(*suite).watchersDuplicateRace},

	{"List/EmptyIsNotError",
		"ListTasks that selects nothing returns no records and no error.",
		(*suite).listEmpty},
	{"List/OrderedByCreatedAtThenID",
		"ListTasks returns whole records ordered by CreatedAt, then by ID, as CompareRecords orders them.",
		listing(workers.Filter{}, "alice::a", "alice::b", "bob::a", "carol::c", "bob::b", "nightly", "erin", "erin:x")},
	{"List/VisibleToWatcher",
		"Filter.VisibleTo keeps the records that list the user as a watcher, global ids included.",
		listing(workers.Filter{VisibleTo: "bob"}, "bob::a", "bob::b", "erin")},
	{"List/VisibleToOwner",
		"Filter.VisibleTo keeps the user-scoped ids the user owns even where it is not a listed watcher, beside those it watches.",
		listing(workers.Filter{VisibleTo: "alice"}, "alice::a", "alice::b", "bob::a")},
	{"List/GlobalIDHasNoOwner",
		`a global id (one without "::") is visible only to its listed watchers, even to a user whose id it spells.`,
		listing(workers.Filter{VisibleTo: "erin"})},
	{"List/ByStatus",
		"Filter.Statuses keeps the records in one of the listed statuses.",
		listing(workers.Filter{Statuses: []workers.Status{workers.StatusCompleted, workers.StatusFailed, workers.StatusCancelled}}, "bob::a", "bob::b", "erin")},
	{"List/ByQueue",
		"Filter.Queue keeps the records of that sequential queue.",
		listing(workers.Filter{Queue: "q2"}, "carol::c", "nightly")},
	{"List/FiltersCombine",
		"the Filter fields combine: a record is listed only if it passes every one that is set.",
		listing(workers.Filter{VisibleTo: "alice", Statuses: []workers.Status{workers.StatusRunning, workers.StatusCompleted}, Queue: "q1"}, "alice::b", "bob::a")},
	{"List/LimitAfterFilterAndOrder",
		"Filter.Limit keeps the first records of the filtered, ordered result.",
		listing(workers.Filter{VisibleTo: "bob", Limit: 2}, "bob::a", "bob::b")},
	{"List/NegativeLimitIsNoLimit",
		"Filter.Limit limits only when positive: a negative one returns every record.",
		listing(workers.Filter{Limit: -1}, "alice::a", "alice::b", "bob::a", "carol::c", "bob::b", "nightly", "erin", "erin:x")},
	{"List/NewestFirst",
		"Filter.Order NewestFirst returns the exact reverse of the OldestFirst order.",
		listing(workers.Filter{Order: workers.NewestFirst}, "erin:x", "erin", "nightly", "bob::b", "carol::c", "bob::a", "alice::b", "alice::a")},
	{"List/NewestFirstVisibleTo",
		"Filter.Order applies to a user's listing: its newest tasks, owned or watched, come first, and Limit keeps those.",
		listing(workers.Filter{VisibleTo: "alice", Order: workers.NewestFirst, Limit: 2}, "bob::a", "alice::b")},
	{"List/PagesWalkTheWholeListing",
		"Filter.After with Limit pages through exactly the records the unpaged listing returns, in the same order, in either Order, for System and per user, with other filters set, and records without a CreatedAt sort as the oldest.",
		(*suite).listPages},
	{"List/PagesAfterAMovedRecord",
		"Filter.After is a position, not a record: a page after the position of a record that ReplaceTask has since moved, or that DeleteFinished has deleted, goes on from where that record was.",
		(*suite).listAfterMoved},
	{"List/AfterAFarOffPosition",
		"Filter.After at a time beyond every time a store holds (year -300,000 or 300,000) is a position like any other: before or after every record, never an error.",
		(*suite).listAfterFarOff},
	{"List/AfterAPositionBetweenMicroseconds",
		"Filter.After at a time between two microseconds selects exactly what Filter.Match selects: a record stored at the microsecond before it comes before it in OldestFirst, and one at the microsecond after comes after it, whatever their ids; NewestFirst is the reverse.",
		(*suite).listAfterSubMicrosecond},
	{"List/UnstorableFilterMatchesNothing",
		"a Filter.VisibleTo or Filter.Queue holding a NUL byte or invalid UTF-8, which no record holds, selects nothing and is no error of its own.",
		(*suite).listUnstorableFilter},
	{"List/VisibleToIsExact",
		"Filter.VisibleTo matches user ids byte for byte, as Runtime.Status does: a user whose id differs from a watcher's or an owner's only in case, by a prefix, a suffix, a substring, trailing spaces or LIKE wildcards sees none of their records.",
		(*suite).listVisibleExact},
	{"List/FollowsWatcherChanges",
		"Filter.VisibleTo follows AddWatcher and ReplaceTask: an added watcher sees the record, a watcher a replace drops does not, and the owner always does.",
		(*suite).listFollowsWatchers},

	{"Delete/FinishedBeforeCutoff",
		"DeleteFinished deletes the terminal records completed before cutoff (and those without a CompletedAt), keeps PENDING and RUNNING records however old and terminal ones completed since, and returns how many it deleted; a cutoff beyond every time a store holds deletes every terminal record, or none, without an error.",
		(*suite).deleteFinished},
	{"Delete/CutoffBetweenMicroseconds",
		"DeleteFinished with a cutoff between two microseconds deletes the records completed at the microsecond before it, which is before the cutoff, and keeps those completed at the microsecond after.",
		(*suite).deleteSubMicrosecond},
	{"Delete/LeavesNothingBehind",
		"a record DeleteFinished deleted leaves nothing: a new record of its id has only its own watchers, and a watcher of the old one no longer sees the id.",
		(*suite).deleteThenReinsert},

	{"Aliasing/InsertNotRetained",
		"changing the slices of a record after InsertTask does not change what the store returns.",
		(*suite).aliasInsert},
	{"Aliasing/ReplaceNotRetained",
		"changing the slices of a record after ReplaceTask does not change what the store returns.",
		(*suite).aliasReplace},
	{"Aliasing/StateWritesNotRetained",
		"changing the Result bytes of a state after SetTask or TransitionTask does not change what the store returns.",
		(*suite).aliasStateWrites},
	{"Aliasing/GetResultNotShared",
		"a record GetTask returned shares nothing with the store: changing it changes nothing stored, and later writes do not change it.",
		(*suite).aliasGet},
	{"Aliasing/ListResultNotShared",
		"a record ListTasks returned shares nothing with the store: changing it changes nothing stored, and later writes do not change it.",
		(*suite).aliasList},

	{"Authorizers/UnsetIsNil",
		"a new store holds no authorizers: both getters return nil.",
		(*suite).authUnset},
	{"Authorizers/SetThenGet",
		"each getter returns the authorizer its setter stored, which answers as the one set, and the two slots are independent.",
		(*suite).authSetGet},
	{"Authorizers/ReplaceTakesEffect",
		"setting an authorizer again replaces the one stored before.",
		(*suite).authReplace},
	{"Authorizers/SetNilClears",
		"setting a nil authorizer removes the one stored: the getter returns nil.",
		(*suite).authClear},
	{"Authorizers/StoredNotCalled",
		"storing and fetching an authorizer never calls it, so even one that panics is stored safely.",
		(*suite).authNotCalled},
	{"Authorizers/ConcurrentUse",
		"authorizers may be set, fetched and called from many goroutines at once.",
		(*suite).authRace},

	{"RoundTrip/EndingFields",
		"the State fields of how a run ended (Cause, CancelledBy, CancelReason, Stack) come back as written through InsertTask, TransitionTask and SetTask, and ReplaceTask clears them with the rest of the state.",
		(*suite).roundTripEndingFields},
	{"State/UnstorableRefused",
		"InsertTask, SetTask, ReplaceTask and TransitionTask (even with an empty from) refuse, with ErrInvalidData, a state whose text fields hold a NUL byte or invalid UTF-8, or whose Progress lies outside 0 to 100 or Attempt outside 0 to math.MaxInt32, as CheckState does, and write nothing.",
		(*suite).unstorableRefused},

	{"Context/DoneRefused",
		"every write given a context that is already done (InsertTask, SetTask, ReplaceTask, TransitionTask, AddWatcher, DeleteFinished whatever its cutoff, and a Leaser's RenewLease) returns an error that wraps the context's, and writes nothing: a write a runtime gave up on, at Shutdown's cutoff, never lands later.",
		(*suite).doneContextRefused},

	{"Lease/RenewCreatesThenExtends",
		"a Leaser's first RenewLease of an instance creates its lease (extended = false) and makes it live; a renewal of a live lease reports extended = true; LiveInstances lists every live instance.",
		(*suite).leaseRenew},
	{"Lease/ReleaseEndsIt",
		"ReleaseLease ends that instance's lease at once and no other; the next RenewLease creates a new one (extended = false); releasing a lease that does not exist is not an error.",
		(*suite).leaseRelease},
	{"Lease/ExpiresByTheStoresClock",
		"a lease not renewed for its ttl, by the store's clock, leaves LiveInstances about then (within 2s of its end) while a longer one stays, and the next RenewLease reports extended = false.",
		(*suite).leaseExpiry},
	{"Lease/NonPositiveTTLRefused",
		"RenewLease with a ttl of zero or less returns ErrInvalidOption and creates no lease.",
		(*suite).leaseTTLRefused},

	{"Notify/EveryWriteReachesEveryListener",
		"a Notifier's Listen first calls its func with a Resync; then every changing write (InsertTask, TransitionTask, ReplaceTask, AddWatcher, SetTask) reaches every listener as a notice naming the task, in write order, the last one naming the record's final run and status (where the store reports them); Listen returns context.Canceled once its context is cancelled.",
		(*suite).notifyWrites},
	{"Notify/ListenEndsWithItsContext",
		"Listen with a done context returns its error; a Listen whose context is cancelled returns context.Canceled; writes after a listener left neither block nor fail.",
		(*suite).notifyListenEnds},

	{"Clear/EmptiesStore",
		"a store that implements RecordClearer deletes every record on ClearRecords, finished or not.",
		(*suite).clearEmpties},
	{"Clear/DurableHasNoClearer",
		"a durable store does not implement RecordClearer, so Runtime.Reset can never delete its records.",
		(*suite).clearDurable},
}

// within runs body under the watchdog. body gets a context that is
// cancelled if it has not returned within the suite's timeout; the case
// then fails. body runs on a goroutine of its own, so it, and every
// goroutine it starts, reports with t.Error, never t.Fatal.
func (su *suite) within(t *testing.T, body func(ctx context.Context)) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	done := make(chan struct{})
	go func() {
		defer close(done)
		body(ctx)
	}()
	timer := time.NewTimer(su.timeout)
	defer timer.Stop()
	select {
	case <-done:
		return
	case <-timer.C:
	}
	t.Errorf("store hung: the case did not finish within %v; cancelling its context", su.timeout)
	cancel()
	timer.Reset(su.timeout)
	select {
	case <-done:
	case <-timer.C:
		t.Errorf("still blocked %v after its context was cancelled; abandoning its goroutines", su.timeout)
	}
	t.FailNow()
}

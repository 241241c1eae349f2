package workers

// changeKind names a change in a task's life that this runtime made or
// saw.
type changeKind uint8

const (
	changeSubmitted changeKind = iota + 1 // a new run was registered (PENDING)
	changeJoined                          // a submission joined a live run
	changeStarted                         // the run's start write landed (RUNNING)
	changeProgress                        // a progress write landed (sync loop)
	changeRetrying                        // an attempt failed and another follows
	changeFinished                        // a terminal write landed, whoever made it
	changeRecovered                       // recovery ended another run as abandoned
)

// change is what emit reports: the store write that made it has landed.
type change struct {
	kind  changeKind
	id    string
	runID string
	queue string
	task  *Task // the live run, when this runtime holds it; else nil
	state State // the state the write stored (identity fields excluded)
	err   error // the callback's error, for changeRetrying and changeFinished
}

// emit reports c to this runtime's observers. It is called after the
// store write that made the change has landed, with no runtime, task or
// store lock held, from the goroutine that made the write.
func (rt *Runtime[S]) emit(c *change) {
	rt.bells.ring(c.id)
}

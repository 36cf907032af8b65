package messages

// CancelResult says what a cancel request did.
type CancelResult string

// Cancel results.
const (
	// CancelQueued: the run had not started; it is now cancelled and will
	// be skipped when its request is delivered.
	CancelQueued CancelResult = "cancelled"
	// CancelStopping: the run was running; its container is being stopped
	// (SIGTERM, the grace period, then SIGKILL) and it will end cancelled.
	CancelStopping CancelResult = "stopping"
	// CancelAlreadyFinal: the run had already ended; nothing changed.
	CancelAlreadyFinal CancelResult = "already_final"
	// CancelError: the cancel could not be carried out; Message says why.
	CancelError CancelResult = "error"
)

// CancelReply is the JSON reply to a request on jetcrew.cancel.<run_id>.
type CancelReply struct {
	// RunID is the run the request named.
	RunID string `json:"run_id"`
	// Result says what happened.
	Result CancelResult `json:"result"`
	// State is the run's state after the request.
	State State `json:"state,omitempty"`
	// Worker is the worker that acted, when one did.
	Worker string `json:"worker,omitempty"`
	// Message explains the result in words.
	Message string `json:"message"`
}

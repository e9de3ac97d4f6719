package wire

// Node approval (PROTOCOL.md §5.1 and §13). A control plane that approves
// nodes registers every new node pending: register answers status
// "pending", and the node's lease requests answer 200 with no job until an
// operator approves it with POST /operator/workers/{id}/approve.

// RegisterStatusPending is the status register answers for a node that
// awaits an operator's approval; a node that does not answers
// "registered".
const RegisterStatusPending = "pending"

// The approval states of a worker (WorkerView.Approval).
const (
	// ApprovalNotRequired means the node registered where no approval was
	// required, and no operator approved it since.
	ApprovalNotRequired = "not_required"
	// ApprovalPending means the node awaits an operator's approval and is
	// granted no job.
	ApprovalPending = "pending"
	// ApprovalApproved means an operator approved the node.
	ApprovalApproved = "approved"
)

// Limits of an approval's pins.
const (
	// MaxApprovalPins bounds job_types, and tags, of an approval.
	MaxApprovalPins = 64
	// MaxApprovalPinBytes bounds each of them; they hold no whitespace.
	MaxApprovalPinBytes = 128
	// MaxApprovalReasonBytes bounds an approval's reason.
	MaxApprovalReasonBytes = 1024
)

// ApproveRequest is the optional body of POST
// /operator/workers/{id}/approve. JobTypes, when given, pins the job types
// the worker may be granted (its registered types among them); Tags pins
// the tags the operator vouches for. Absent or null pins nothing; an
// empty array is refused. Each holds 1 to MaxApprovalPins values of 1 to
// MaxApprovalPinBytes bytes without whitespace or control characters.
type ApproveRequest struct {
	JobTypes *[]string `json:"job_types"`
	Tags     *[]string `json:"tags"`
	// Reason is recorded on the approval and in its receipt; at most
	// MaxApprovalReasonBytes.
	Reason string `json:"reason"`
}

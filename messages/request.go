package messages

import (
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"
)

// RequestVersion is the version of the run request format this package reads
// and writes. A request may carry it in its "version" field; a request without
// one is read as this version.
const RequestVersion = 1

// Limits on a run request. A request beyond them is refused.
const (
	// MaxRequestBytes is the largest encoded run request accepted, in bytes.
	MaxRequestBytes = 256 << 10
	// MaxRequestHeaderBytes is what a run request message's headers may
	// take beside its body, in bytes, as NATS encodes them ("NATS/1.0",
	// then "Name: value" lines): room for Nats-Msg-Id, the signature
	// headers (HeaderSigner, HeaderSignature) and a client's tracing.
	MaxRequestHeaderBytes = 4 << 10
	// MaxRequestMsgBytes is the largest run request message StreamRuns
	// stores, headers and body together (its max_msg_size): a larger
	// publish is refused by the stream.
	MaxRequestMsgBytes = MaxRequestBytes + MaxRequestHeaderBytes
	// MaxEnvVars is the largest number of entries in RunRequest.Env.
	MaxEnvVars = 64
	// MaxEnvValueBytes is the longest value of one RunRequest.Env entry, in bytes.
	MaxEnvValueBytes = 4 << 10
	// MaxLabels is the largest number of entries in RunRequest.Labels.
	MaxLabels = 32
	// MaxLabelBytes is the longest key or value of one label, in bytes.
	MaxLabelBytes = 256
	// MaxTimeout is the longest run timeout a request may ask for.
	MaxTimeout = 24 * time.Hour
)

// ErrInvalidRequest is wrapped by every error DecodeRunRequest and
// RunRequest.Validate return for a request that is malformed or breaks a
// rule. Such a request is never retried.
var ErrInvalidRequest = errors.New("invalid run request")

// RunRequest is a run request, version 1: what to run, not how. The worker's
// profile named by Profile decides the image, command, user, limits, network
// and mounts; nothing here can choose them.
//
// Its JSON form is published to jetcrew.runs.<pool> (SubjectRuns; an
// operator's replay to SubjectReplay) on stream StreamRuns. The JSON Schema
// is docs/run-request.schema.json.
type RunRequest struct {
	// Version is the request format version; 0 or absent means
	// RequestVersion. Any other value is refused.
	Version int `json:"version,omitempty"`
	// ID identifies the run: a subject token that is none of ReservedNames
	// (see ValidateName). When empty, dispatcher.Encode assigns a ULID; a
	// worker receiving a request without one derives a ULID from the stream
	// message (its time and sequence; docs/wire.md, "Submitting a run").
	ID string `json:"id,omitempty"`
	// Profile names the worker-side profile to run with. Required.
	Profile string `json:"profile"`
	// Prompt is the text handed to the profile's command (for the built-in
	// shell profile, the shell script).
	Prompt string `json:"prompt,omitempty"`
	// Pool selects the subject, and so the workers, that take the run;
	// DefaultPool when empty.
	Pool string `json:"pool,omitempty"`
	// Group names the runs that may coordinate with each other. With Pool
	// it names the group (GroupRef): the same name in another pool is
	// another group. Empty, or the run's own ID: the run is alone in a
	// group of its own, named by its id, which no request can join
	// (decoding and WithDefaults make a group equal to the ID empty).
	Group string `json:"group,omitempty"`
	// GroupKey is the group's NKey user public key ("U…", 56 characters):
	// the request is signed by its seed (HeaderGroupSignature) and joins
	// Group only when the group's first run carried the same key (a
	// GroupRecord; docs/security.md, "Groups and pools"). It requires
	// Group, and a worker refuses a keyed body that names no ID. Absent:
	// the request joins only a group that has no key.
	GroupKey string `json:"group_key,omitempty"`
	// Timeout bounds the run's wall time, as a Go duration string ("90s",
	// "1h"). Empty means the profile's, else the worker's, default.
	Timeout Duration `json:"timeout,omitempty"`
	// Env holds non-secret environment variables for the run's process.
	// Names must match [A-Za-z_][A-Za-z0-9_]* and must not start with
	// "JETCREW_". Secrets never travel in a request; profiles take them from
	// the worker's environment by name.
	Env map[string]string `json:"env,omitempty"`
	// Labels are free-form key/value pairs copied into the run's state.
	Labels map[string]string `json:"labels,omitempty"`
	// Workspace, when set, names the snapshot the run works on: it is
	// unpacked, writable, at WorkspaceDir, and what the run changed there is
	// captured when it ends (RunState.WorkspaceResult). Absent: no
	// workspace, as before this field existed.
	Workspace *WorkspaceRef `json:"workspace,omitempty"`
	// Session, when set, makes the run a follow-up that resumes the agent
	// CLI's session of the earlier run its workspace starts from
	// (SessionRef; docs/workspaces.md, "Follow-ups"). Workers older than
	// it refuse the request (unknown key).
	Session *SessionRef `json:"session,omitempty"`
}

// Duration is a time.Duration that reads and writes JSON as a Go duration
// string ("1m30s").
type Duration time.Duration

// MarshalJSON encodes d as a duration string, or "" for zero.
func (d Duration) MarshalJSON() ([]byte, error) {
	if d == 0 {
		return []byte(`""`), nil
	}
	return json.Marshal(time.Duration(d).String())
}

// UnmarshalJSON decodes a duration string such as "90s" (time.ParseDuration
// syntax). It returns an error for any other JSON value.
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("duration must be a string such as \"90s\": %w", err)
	}
	if s == "" {
		*d = 0
		return nil
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return err
	}
	*d = Duration(v)
	return nil
}

var envNameRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// ValidEnvName reports whether name is a valid environment variable name:
// [A-Za-z_][A-Za-z0-9_]*.
func ValidEnvName(name string) bool { return envNameRE.MatchString(name) }

// DecodeRunRequest decodes and validates one run request from data, which
// must be a single JSON object of at most MaxRequestBytes bytes whose keys are
// exactly the documented names, each at most once, at every depth (see
// DecodeStrictJSON). It returns the request with defaults applied
// (Pool, Version) or an error wrapping ErrInvalidRequest that says what is
// wrong.
func DecodeRunRequest(data []byte) (RunRequest, error) {
	return DecodeRunRequestInPool(data, DefaultPool)
}

// DecodeRunRequestInPool is DecodeRunRequest for a request that arrived on
// pool's subject: a request naming no pool gets pool, not DefaultPool. Its
// errors are DecodeRunRequest's.
func DecodeRunRequestInPool(data []byte, pool string) (RunRequest, error) {
	var r RunRequest
	if len(data) > MaxRequestBytes {
		return r, fmt.Errorf("%w: %d bytes, largest allowed is %d", ErrInvalidRequest, len(data), MaxRequestBytes)
	}
	if err := DecodeStrictJSON(data, &r); err != nil {
		return RunRequest{}, fmt.Errorf("%w: %v", ErrInvalidRequest, err)
	}
	if r.Pool == "" {
		r.Pool = pool
	}
	r.applyDefaults()
	if err := r.Validate(); err != nil {
		return RunRequest{}, err
	}
	return r, nil
}

func (r *RunRequest) applyDefaults() {
	if r.Version == 0 {
		r.Version = RequestVersion
	}
	if r.Pool == "" {
		r.Pool = DefaultPool
	}
	if r.Group != "" && r.Group == r.ID {
		r.Group = "" // the run's own group
	}
	if len(r.Env) == 0 {
		r.Env = nil
	}
	if len(r.Labels) == 0 {
		r.Labels = nil
	}
}

// WithDefaults returns a copy of r with Version and Pool filled in when
// empty, and a Group equal to the ID made empty (the run's own group).
func (r RunRequest) WithDefaults() RunRequest {
	r.applyDefaults()
	return r
}

// Validate checks every field of r against the rules of this version and
// returns the first breach as an error wrapping ErrInvalidRequest. An empty
// ID is allowed (one is assigned later); empty Pool and Version are read as
// their defaults.
func (r RunRequest) Validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrInvalidRequest, fmt.Sprintf(format, args...))
	}
	if r.Version != 0 && r.Version != RequestVersion {
		return bad("version %d is not supported (this worker reads version %d)", r.Version, RequestVersion)
	}
	if r.Profile == "" {
		return bad("profile is required")
	}
	if err := ValidateToken("profile", r.Profile); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidRequest, err)
	}
	if r.ID != "" {
		if err := ValidateName("id", r.ID); err != nil {
			return fmt.Errorf("%w: %w", ErrInvalidRequest, err)
		}
	}
	if r.Pool != "" {
		if err := ValidateName("pool", r.Pool); err != nil {
			return fmt.Errorf("%w: %w", ErrInvalidRequest, err)
		}
	}
	if r.Group != "" {
		if err := ValidateName("group", r.Group); err != nil {
			return fmt.Errorf("%w: %w", ErrInvalidRequest, err)
		}
	}
	if err := r.validateGroupKey(); err != nil {
		return err
	}
	if r.Timeout < 0 {
		return bad("timeout %s is negative", time.Duration(r.Timeout))
	}
	if time.Duration(r.Timeout) > MaxTimeout {
		return bad("timeout %s is longer than the longest allowed, %s", time.Duration(r.Timeout), MaxTimeout)
	}
	if len(r.Env) > MaxEnvVars {
		return bad("env has %d entries, most allowed is %d", len(r.Env), MaxEnvVars)
	}
	for k, v := range r.Env {
		if !envNameRE.MatchString(k) {
			return bad("env name %q is not a valid variable name ([A-Za-z_][A-Za-z0-9_]*)", k)
		}
		if strings.HasPrefix(strings.ToUpper(k), "JETCREW_") {
			return bad("env name %q is reserved (JETCREW_ prefix)", k)
		}
		if len(v) > MaxEnvValueBytes {
			return bad("env %s value is %d bytes, longest allowed is %d", k, len(v), MaxEnvValueBytes)
		}
		if strings.IndexByte(v, 0) >= 0 {
			return bad("env %s value contains a NUL byte", k)
		}
	}
	if len(r.Labels) > MaxLabels {
		return bad("labels has %d entries, most allowed is %d", len(r.Labels), MaxLabels)
	}
	for k, v := range r.Labels {
		if k == "" || len(k) > MaxLabelBytes || len(v) > MaxLabelBytes {
			return bad("label %q: keys must be 1 to %d bytes and values at most %d bytes", k, MaxLabelBytes, MaxLabelBytes)
		}
	}
	if r.Session != nil {
		if err := r.Session.Validate(r.Workspace); err != nil {
			return err
		}
	}
	if r.Workspace != nil {
		return r.Workspace.Validate()
	}
	return nil
}

// validateGroupKey checks GroupKey: the shape of an NKey user public key,
// on a request that names its group and its run id (a keyed request without
// an id would run under a new id each time it is published again).
func (r RunRequest) validateGroupKey() error {
	switch {
	case r.GroupKey == "":
		return nil
	case !validGroupKeyShape(r.GroupKey):
		return fmt.Errorf("%w: group_key %q is not an NKey user public key (U and 55 characters A-Z, 2-7)", ErrInvalidRequest, r.GroupKey)
	case r.Group == "":
		return fmt.Errorf("%w: group_key without a group: a run alone in its own group needs no key", ErrInvalidRequest)
	}
	return nil
}

// GroupOrID returns r.Group, or r.ID when the request names no group.
func (r RunRequest) GroupOrID() string {
	if r.Group != "" {
		return r.Group
	}
	return r.ID
}

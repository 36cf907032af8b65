package messages

import "time"

// EventPublish: `jetcrew publish` pushed the run's result head to a branch
// of a git remote (body: PublishEvent). Published by the publisher, not by
// a worker, after the run ended: it follows the run's finished event.
const EventPublish EventType = "publish"

// PublishEvent is the body of an EventPublish: what was pushed, where.
// It never holds a credential.
type PublishEvent struct {
	// RunID is the run whose head was pushed.
	RunID string `json:"run_id"`
	// Type is EventPublish.
	Type EventType `json:"type"`
	// Time is when the push was accepted.
	Time time.Time `json:"time"`
	// Remote is the remote's name in the publisher's remotes file.
	Remote string `json:"remote"`
	// URL is the remote's URL, without credentials.
	URL string `json:"url"`
	// Branch is the remote branch pushed to (under refs/heads/).
	Branch string `json:"branch"`
	// Commit is the run's head, the branch's commit after the push.
	Commit string `json:"commit"`
	// Old is the branch's commit before the push, empty when the push
	// created it.
	Old string `json:"old,omitempty"`
	// Forced is true when Old was not an ancestor of Commit and the push
	// replaced it (publish --force).
	Forced bool `json:"forced,omitempty"`
	// PullRequest is the pull request the publisher opened (publish --pr):
	// the URL the endpoint answered with, or the endpoint's URL when it
	// named none.
	PullRequest string `json:"pull_request,omitempty"`
}

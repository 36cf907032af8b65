// Package budgetkv reads and adds to the values of the jetcrew-budgets
// key-value bucket (messages.BucketBudgets): what groups and pools spent
// by window, and what operators granted. Workers add spend; jetcrew budget
// adds grants. Additions are compare-and-set, so none is lost however many
// writers add to one key at once.
package budgetkv

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetcrew/jetcrew/messages"
)

// Get reads key's BudgetSpend and its revision: zero and 0 when the key
// does not exist. It returns the bucket's error, or one for a value that is
// not a BudgetSpend.
func Get(ctx context.Context, kv jetstream.KeyValue, key string) (messages.BudgetSpend, uint64, error) {
	e, err := kv.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return messages.BudgetSpend{}, 0, nil
	}
	if err != nil {
		return messages.BudgetSpend{}, 0, err
	}
	var v messages.BudgetSpend
	if err := json.Unmarshal(e.Value(), &v); err != nil {
		return messages.BudgetSpend{}, 0, fmt.Errorf("budget %s: %w", key, err)
	}
	return v, e.Revision(), nil
}

// Add adds d to key's BudgetSpend by compare-and-set: it reads the value
// and its revision and writes the sum only if the key is still at that
// revision (creates it only if it still does not exist), trying again with
// backoff (1 ms to 100 ms) when another writer came first, until ctx ends.
// It returns the sum it wrote, or the last error once ctx ended.
func Add(ctx context.Context, kv jetstream.KeyValue, key string, d messages.BudgetSpend) (messages.BudgetSpend, error) {
	sum, _, err := AddIf(ctx, kv, key, d, nil)
	return sum, err
}

// AddIf is Add when admit, called with the key's current value on every
// try, returns true (a nil admit always does); when it returns false,
// nothing is written and AddIf returns the value it saw and false. The
// check and the write are one compare-and-set: no other writer's addition
// comes between them, so a limit admit checks is never passed by writers
// adding at once.
func AddIf(ctx context.Context, kv jetstream.KeyValue, key string, d messages.BudgetSpend, admit func(cur messages.BudgetSpend) bool) (messages.BudgetSpend, bool, error) {
	var sum messages.BudgetSpend
	admitted := true
	op := func() error {
		cur, rev, err := Get(ctx, kv, key)
		if err != nil {
			return err
		}
		if admit != nil && !admit(cur) {
			sum, admitted = cur, false
			return nil
		}
		admitted = true
		sum = cur.Add(d)
		data, _ := json.Marshal(sum) // a BudgetSpend always marshals
		if rev == 0 {
			_, err = kv.Create(ctx, key, data)
		} else {
			_, err = kv.Update(ctx, key, data, rev)
		}
		return err
	}
	bo := backoff.NewExponentialBackOff()
	bo.InitialInterval, bo.MaxInterval, bo.MaxElapsedTime = time.Millisecond, 100*time.Millisecond, 0
	if err := backoff.Retry(op, backoff.WithContext(bo, ctx)); err != nil {
		return messages.BudgetSpend{}, false, fmt.Errorf("add to budget %s: %w", key, err)
	}
	return sum, admitted, nil
}

// Update replaces key's value by what next returns for the current one
// (nil and 0 when the key does not exist), by compare-and-set, trying
// again with backoff (1 ms to 100 ms) when another writer came first,
// until ctx ends; next returning write false leaves the key as it is.
// It returns the value written (or left), or the last error once ctx
// ended, or next's error at once.
func Update(ctx context.Context, kv jetstream.KeyValue, key string, next func(cur []byte) (val []byte, write bool, err error)) ([]byte, error) {
	var out []byte
	op := func() error {
		var cur []byte
		var rev uint64
		e, err := kv.Get(ctx, key)
		switch {
		case errors.Is(err, jetstream.ErrKeyNotFound):
		case err != nil:
			return err
		default:
			cur, rev = e.Value(), e.Revision()
		}
		val, write, err := next(cur)
		if err != nil {
			return backoff.Permanent(err)
		}
		out = val
		if !write {
			out = cur
			return nil
		}
		if rev == 0 {
			_, err = kv.Create(ctx, key, val)
		} else {
			_, err = kv.Update(ctx, key, val, rev)
		}
		return err
	}
	bo := backoff.NewExponentialBackOff()
	bo.InitialInterval, bo.MaxInterval, bo.MaxElapsedTime = time.Millisecond, 100*time.Millisecond, 0
	if err := backoff.Retry(op, backoff.WithContext(bo, ctx)); err != nil {
		return nil, fmt.Errorf("update %s: %w", key, err)
	}
	return out, nil
}

// Package layers holds the test that keeps jetcrew's packages in their
// layers (layers_test.go): which package may depend on which, as
// ../shared/STYLE.md draws the arrows. It has no code of its own; the
// compiler and this test hold the seams, not review.
package layers

package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/jetcrew/jetcrew/dispatcher"
	"github.com/jetcrew/jetcrew/messages"
)

// questionCmds are `jetcrew questions` and `jetcrew answer`: the runs'
// questions to the operator (their ask tool) and the operator's answers.
func (a operatorCmds) questionCmds() []*cobra.Command {
	var url string
	list := &cobra.Command{
		Use:   "questions",
		Short: "List the runs' questions waiting for an operator, one a line, its id first",
		Long: `A run's agent that calls ask with to "operator" waits for an answer until its
timeout. jetcrew questions lists those questions, oldest first, one a line:

  QUESTION_ID  RUN_ID  GROUP  ASKED_AGO  LEFT  QUESTION [choices: a | b]

The question's text is the agent's, shown with control characters, newlines
and tabs escaped. Answer one with jetcrew answer QUESTION_ID TEXT. Nothing is
printed on stdout when no question waits.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return a.runQuestions(cmd.Context(), url)
		},
	}
	natsFlag(list, &url)
	return []*cobra.Command{list, a.answerCmd()}
}

func (a operatorCmds) runQuestions(ctx context.Context, url string) error {
	d, closeNATS, err := a.dispatcher(a.natsURL(url), "jetcrew questions")
	if err != nil {
		return err
	}
	defer closeNATS()
	qs, err := d.OpenQuestions(ctx)
	if err != nil {
		return err
	}
	if len(qs) == 0 {
		fmt.Fprintln(a.stderr, "no question waits for an operator")
		return nil
	}
	tw := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
	for _, q := range qs {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", q.ID, visibleName(q.RunID), visibleName(q.Group),
			time.Since(q.Time).Round(time.Second), time.Until(q.Until).Round(time.Second), questionText(q))
	}
	return tw.Flush()
}

// questionText is q's text and choices on one line, escaped (visibleName).
func questionText(q messages.CoordQuestion) string {
	s := visibleName(q.Question)
	if len(q.Choices) > 0 {
		cs := make([]string, len(q.Choices))
		for i, c := range q.Choices {
			cs[i] = visibleName(c)
		}
		s += " [choices: " + strings.Join(cs, " | ") + "]"
	}
	return s
}

func (a operatorCmds) answerCmd() *cobra.Command {
	var url, by string
	cmd := &cobra.Command{
		Use:   "answer [flags] QUESTION_ID TEXT",
		Short: "Answer a run's question to the operator (an id from jetcrew questions)",
		Long: `The run's ask call returns TEXT as the answer, from "operator". The first
answer is the one the run gets; an answer to a question already answered,
timed out or of a run that ended is refused. Operators only (docs/security.md).`,
		Args: exactArgs("QUESTION_ID", "TEXT"),
		RunE: func(cmd *cobra.Command, args []string) error {
			d, closeNATS, err := a.dispatcher(a.natsURL(url), "jetcrew answer")
			if err != nil {
				return err
			}
			defer closeNATS()
			q, err := d.AnswerQuestion(cmd.Context(), args[0], args[1], by)
			switch {
			case errors.Is(err, dispatcher.ErrNoQuestion):
				return fmt.Errorf("%s: no question waits under this id (answered, timed out, its run ended, or never asked)", args[0])
			case errors.Is(err, dispatcher.ErrAnswered):
				return fmt.Errorf("%s: already answered", args[0])
			case errors.Is(err, dispatcher.ErrNotToOperator):
				return fmt.Errorf("%s: run %s asked %s, not the operator: only its peers answer it", args[0], visibleName(q.RunID), visibleName(q.To))
			case err != nil:
				return err
			}
			fmt.Fprintf(a.stdout, "%s: answered run %s\n", q.ID, visibleName(q.RunID))
			return nil
		},
	}
	natsFlag(cmd, &url)
	cmd.Flags().StringVar(&by, "by", defaultDecider(), "who answers, as the question's answer records it (the run is told \"operator\")")
	return cmd
}

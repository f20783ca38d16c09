package main

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"google.golang.org/genproto/googleapis/rpc/code"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	adminv1 "github.com/idemkit/idem/gen/idem/admin/v1"
)

// printJSON prints m as protobuf's JSON mapping, one document.
func printJSON(w io.Writer, m proto.Message) error {
	b, err := protojson.MarshalOptions{Multiline: true, Indent: "  "}.Marshal(m)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "%s\n", b)
	return err
}

// printKeys prints keys as a table, one key a row.
func printKeys(w io.Writer, keys []*adminv1.Key) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "KEY\tTENANT\tMETHOD\tSTATE\tCREATED\tEXPIRES\tLEASE UNTIL\tTAKEOVERS\tREPLAYS")
	for _, k := range keys {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t%d\n", k.GetKey(), orDash(k.GetTenant()), k.GetMethod(),
			stateName(k.GetState()), timeOf(k.GetCreateTime()), timeOf(k.GetExpireTime()), timeOf(k.GetLeaseExpireTime()), k.GetTakeovers(),
			k.GetReplays())
	}
	tw.Flush()
}

// printKey prints everything kept of k, a field a line.
func printKey(w io.Writer, k *adminv1.Key) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	row := func(name, value string) { fmt.Fprintf(tw, "%s:\t%s\n", name, value) }
	row("key", k.GetKey())
	row("tenant", orDash(k.GetTenant()))
	row("method", k.GetMethod())
	row("state", stateName(k.GetState()))
	row("created", timeOf(k.GetCreateTime()))
	row("updated", timeOf(k.GetUpdateTime()))
	row("expires", timeOf(k.GetExpireTime()))
	row("lease until", timeOf(k.GetLeaseExpireTime()))
	row("takeovers", strconv.Itoa(int(k.GetTakeovers())))
	row("replays", strconv.FormatInt(k.GetReplays(), 10))
	row("last replay", timeOf(k.GetLastReplayTime()))
	row("fingerprint", orDash(hex.EncodeToString(k.GetFingerprint())))
	row("finishable", strconv.FormatBool(k.GetFinishable()))
	var steps []string
	for _, s := range k.GetSteps() {
		steps = append(steps, fmt.Sprintf("%s (%d bytes)", s.GetName(), len(s.GetResult())))
	}
	row("steps", orDash(strings.Join(steps, ", ")))
	if out := k.GetOutcome(); out != nil {
		row("outcome", code.Code(out.GetCode()).String())
		switch r := out.GetResult().(type) {
		case *adminv1.Outcome_Error:
			row("message", r.Error.GetMessage())
			if n := len(r.Error.GetDetails()); n > 0 {
				row("details", fmt.Sprintf("%d (see -o json)", n))
			}
		case *adminv1.Outcome_Response:
			js, err := compactJSON(r.Response)
			if err != nil {
				return err
			}
			row("response", fmt.Sprintf("%s %s", out.GetResponseType(), js))
		case *adminv1.Outcome_RawResponse:
			row("response", fmt.Sprintf("%d bytes, undecoded (see -o json)", len(r.RawResponse)))
		}
		if out.GetNotCached() {
			row("not cached", "true: the response was too large to record")
		}
		if note := out.GetNote(); note != "" {
			row("note", note)
		}
	}
	if req := k.GetRequest(); req != nil {
		switch b := req.GetBody().(type) {
		case *adminv1.Request_Decoded:
			js, err := compactJSON(b.Decoded)
			if err != nil {
				return err
			}
			row("request", fmt.Sprintf("%s %s", req.GetRequestType(), js))
		case *adminv1.Request_Raw:
			row("request", fmt.Sprintf("%d bytes, undecoded (see -o json)", len(b.Raw)))
		}
		if note := req.GetNote(); note != "" {
			row("request note", note)
		}
	}
	return tw.Flush()
}

// compactJSON renders m as protobuf's JSON mapping, compact: protojson
// varies its spacing from one build to the next, and the compact form
// reads the same from every idem.
func compactJSON(m proto.Message) ([]byte, error) {
	b, err := protojson.Marshal(m)
	if err != nil {
		return nil, err
	}
	var js bytes.Buffer
	if err := json.Compact(&js, b); err != nil {
		return nil, err
	}
	return js.Bytes(), nil
}

// timeOf formats ts in UTC to the second, "-" when unset.
func timeOf(ts *timestamppb.Timestamp) string {
	if ts == nil {
		return "-"
	}
	return ts.AsTime().UTC().Format(time.RFC3339)
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

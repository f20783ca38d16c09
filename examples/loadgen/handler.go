package main

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	paymentsv1 "github.com/idemkit/idem/examples/gen/payments/v1"
)

// handler is the business writes of one CreatePayment, which every scenario
// (-handler picks one) runs on a transaction: idem's, in atomic mode
// (postgres.TxFromContext), naive's, or one of its own.
type handler struct {
	name  string
	about string
	// statements is how many statements write sends, one round trip each.
	statements int
	// schema is created in each scenario's fresh database after
	// paymentsvc's; empty for none.
	schema string
	// write runs the handler's statements on tx for the payment req,
	// stored under tenant and key, and returns the payment's id and time.
	write func(ctx context.Context, tx pgx.Tx, tenant, key string, req *paymentsv1.CreatePaymentRequest) (id string, created time.Time, err error)
}

// handlers is the handler table; the first is the default.
var handlers = []*handler{
	{
		name:       "payment",
		about:      "the payment insert, paymentsvc's one statement",
		statements: 1,
		write:      writePayment,
	},
	{
		name:       "ledger",
		about:      "the payment insert, the customer's balance update and a ledger entry's insert, three statements one after the other",
		statements: 3,
		schema:     ledgerSchema,
		write:      writeLedger,
	},
}

func handlerNames() []string {
	var names []string
	for _, h := range handlers {
		names = append(names, h.name)
	}
	return names
}

// handlerUsage lists the handlers for -h.
func handlerUsage() string {
	var l []string
	for _, h := range handlers {
		l = append(l, h.name+": "+h.about)
	}
	return strings.Join(l, "; ")
}

func lookupHandler(name string) (*handler, error) {
	for _, h := range handlers {
		if h.name == name {
			return h, nil
		}
	}
	return nil, fmt.Errorf("unknown handler %q (have %v)", name, handlerNames())
}

// writePayment is paymentsvc's CreatePayment: the payment insert alone.
func writePayment(ctx context.Context, tx pgx.Tx, tenant, key string, req *paymentsv1.CreatePaymentRequest) (id string, created time.Time, err error) {
	err = tx.QueryRow(ctx, insertPayment,
		tenant, req.GetCustomerId(), req.GetAmountCents(), req.GetCurrency(), req.GetNote(), key,
	).Scan(&id, &created)
	return id, created, err
}

// ledgerSchema is the ledger handler's tables, with an account for each of
// the customers that [request] spreads payments over.
//
//go:embed ledger.sql
var ledgerSchema string

// customers is how many customers [request] spreads payments over, and
// ledger.sql opens accounts for: enough that concurrent payments rarely
// update the same balance.
const customers = 100_000

const (
	updateBalance = `UPDATE accounts SET balance_cents = balance_cents + $3, updated_at = now()
		 WHERE tenant_id = $1 AND customer_id = $2
		 RETURNING balance_cents`
	insertLedgerEntry = `INSERT INTO ledger_entries (tenant_id, customer_id, payment_id, amount_cents, balance_cents)
		 VALUES ($1, $2, $3, $4, $5)`
)

// writeLedger is a payment as a bookkeeping service writes it: the payment
// insert, the customer's balance update, and a ledger entry that names the
// payment and the balance after it. Each statement waits for the one
// before, as a handler that uses their results does.
func writeLedger(ctx context.Context, tx pgx.Tx, tenant, key string, req *paymentsv1.CreatePaymentRequest) (id string, created time.Time, err error) {
	if id, created, err = writePayment(ctx, tx, tenant, key, req); err != nil {
		return "", time.Time{}, err
	}
	var balance int64
	err = tx.QueryRow(ctx, updateBalance, tenant, req.GetCustomerId(), req.GetAmountCents()).Scan(&balance)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", time.Time{}, status.Error(codes.NotFound, "the customer has no account")
	}
	if err != nil {
		return "", time.Time{}, err
	}
	if _, err := tx.Exec(ctx, insertLedgerEntry, tenant, req.GetCustomerId(), id, req.GetAmountCents(), balance); err != nil {
		return "", time.Time{}, err
	}
	return id, created, nil
}

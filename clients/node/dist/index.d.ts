/** queen for Node.js: a producer and a consumer loop for queen, the message queue inside
 * PostgreSQL, on node-postgres. */
export { QUEUE_MODE, Message, PushResult, Decision, ErrorPolicy, RetryLater, Poison, defaultErrorPolicy, backoffPolicy, traceparentOf, } from "./common";
export { Producer, PushOptions, BatchItem } from "./producer";
export { Consumer, ConsumerOptions, ConsumerEvent } from "./consumer";
export * from "./errors";

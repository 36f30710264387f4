"""Kafka client plumbing: every connection this project makes to Kafka, and the one rule
that says which partition a request's key lands on.

    kafka_clients.py        kafka-python producers, consumers and admin clients built from
                            Settings (the settings shared with librdkafka written once)
    librdkafka_producer.py  the worker's results producer (confluent-kafka) behind
                            kafka-python's send()/future interface
    partitioner.py          key -> partition (murmur2, Kafka's default partitioner): the
                            worker publishes a request's events where a reader looks for them
    kafka_records.py        tolerant record parsing (no fetched record stops a consumer)
    kafka_parked.py         kafka-python's fetcher: a resumed partition is read again
    kafka_wrap.py           wrapping a kafka-python method once per process (the two fixes)

It imports only the wire (`inflight.schemas`: Settings, the error tree); consumers,
producers, the API and the command line import it (DESIGN.md, "Where things live").
"""

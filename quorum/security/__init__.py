"""Authentication (SASL/PLAIN and SCRAM-SHA-256, optionally inside TLS) and authorization (ACLs).

* ``credentials``: the credentials file (SCRAM-SHA-256 stored keys; they serve PLAIN too).
* ``mechanisms``: the server side of PLAIN and SCRAM-SHA-256, pure (bytes in, bytes out).
* ``sasl``: the per-connection gate both servers (quorum client port, broker) put in front of
  their request handling: ApiVersions and the SASL exchange only, until authenticated.
* ``acl``: ACL entries, matching (literal / prefixed / '*', deny wins) and the authorizer.
* ``tls``: ssl contexts for the servers and for clients.
* ``client``: the client side (``ClientSecurity``), used by ``quorum.client.quorum``.
"""
